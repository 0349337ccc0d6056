"""The upstream CRDs (``external-crds/``, vendored and sha256-checked) that the tests
validate against and install in the real single-node cluster (:mod:`e2e.cluster`)."""
