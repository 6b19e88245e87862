"""Metacontroller hooks for InferaDeployment."""
