"""One room per operator feature, each a step of the reconciliation pass.

``reconcile.py`` is the pass: an ordered list of these steps (the table in
docs/operator.md). Each room owns its reads and writes, calls the pure decision module
of its feature (``scaling``, ``rollout``, ``volumes``, ``certificates``/``pki``,
``tokens``, ``backups``) and returns its part of the observation, from which
``status.py`` makes its condition. ``children`` is what they share: the clients of a
pass and the ownership-checked writes of one child. No room imports Kopf, the handlers
or the pass (an import-linter contract).
"""
