"""Renderers: pure functions from a validated InferaDeployment to its desired children, one
module per child family (hooks.render puts them together)."""
