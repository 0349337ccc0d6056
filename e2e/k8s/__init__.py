"""Test doubles for Kubernetes: the API emulator (kmock-based) and its helpers.

See :mod:`e2e.k8s.emulator`. This is an emulator, not a cluster: no pods run and no
controller or garbage collector acts; tests play those parts where they need them.
"""
