"""The InferaDeployment v1alpha1 API: one typed source for hook validation and the CRD schema.

Attribute docstrings become the CRD's descriptions (`kubectl explain idep.spec...`), so they are
written for users. The CRD generator (hooks.crd) turns these models into a structural schema.
"""
