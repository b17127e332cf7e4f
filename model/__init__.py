"""The executable specification of harel's grouped work queue (``harel_ref.model``).

``QueueModel`` is SPEC.md as code: each rule is one small function or clause, cited by its
number.  It is pure (no I/O, no clock, no randomness): operations take ``now``, and ``claim``
returns the set of allowed answers instead of choosing one.

>>> from harel_ref.model import QueueModel
>>> q = QueueModel()
>>> q.publish("g1", "hello")
>>> sorted(q.claim_outcomes(now=10.0), key=str)
[Claimed(group_id='g1', seq=1, event='hello')]
"""

from ._queue import ACKS, RELAXABLE, Claimed, Fairness, Holding, QueueModel, When

__all__ = ["ACKS", "RELAXABLE", "Claimed", "Fairness", "Holding", "QueueModel", "When"]
