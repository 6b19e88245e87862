// Command merge runs Metacontroller's own 3-way merge (pkg/dynamic/apply.Merge) on each
// [observed, lastApplied, desired] of a JSON list read from stdin, decoded as Metacontroller
// decodes objects (integers as int64), and writes the list of results (or {"error": ...}) to
// stdout: the judge of the merge in tests/support/apply.py.
package main

import (
	"encoding/json"
	"io"
	"os"

	"metacontroller/pkg/dynamic/apply"

	utiljson "k8s.io/apimachinery/pkg/util/json"
)

func main() {
	input, err := io.ReadAll(os.Stdin)
	if err != nil {
		panic(err)
	}
	var cases [][3]map[string]interface{}
	if err := utiljson.Unmarshal(input, &cases); err != nil {
		panic(err)
	}
	results := make([]interface{}, 0, len(cases))
	for _, c := range cases {
		merged, err := apply.Merge(c[0], c[1], c[2])
		if err != nil {
			results = append(results, map[string]string{"error": err.Error()})
			continue
		}
		results = append(results, merged)
	}
	if err := json.NewEncoder(os.Stdout).Encode(results); err != nil {
		panic(err)
	}
}
