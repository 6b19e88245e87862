//go:build tools

// The NetworkPolicy engine the end-to-end tests judge the rendered policies with: its command
// line, built from the module proxy's copy into .cache/netpol (tests/support/netpol.py).
package tools

import _ "github.com/mattfenwick/cyclonus/cmd/cyclonus"
