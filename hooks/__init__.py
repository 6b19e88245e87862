"""Metacontroller hooks for InferaDeployment."""

# pyproject's project.name: the installed distribution whose version --version prints.
DISTRIBUTION = "infera-hooks"
