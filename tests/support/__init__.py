"""What several tests share: the prerequisites kept outside the repo, Metacontroller-shaped
requests, the hook service on loopback, schema validation, and the simulated cluster
(simulator, apiserver, kubelet) and runtime parsers the tests drive."""
