"""One room per operator feature, each a step of the reconciliation pass.

``reconcile.py`` is the pass: an ordered list of these steps. Each module owns its
part of the observation, calls the pure decision module of its feature (``scaling``,
``rollout``, ``volumes``, ``certificates``/``pki``, ``tokens``) and produces its
condition's verdict. ``children`` is what they share: the clients of a pass and the
ownership-checked writes of one child. No module here imports Kopf or the handlers.
"""
