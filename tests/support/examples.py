"""How many examples a Hypothesis test draws, scaled by the loaded profile.

``make test`` runs each property test with the count it names; ``make test-fast`` loads
the ``fast`` profile (``--hypothesis-profile=fast``), which draws a tenth of that: the same
properties and assertions, checked on fewer cases, so the unit tier stays under a minute.
"""

from __future__ import annotations

from hypothesis import settings

#: Hypothesis's own default, against which a profile's ``max_examples`` is a scale.
DEFAULT_EXAMPLES = 100

settings.register_profile("fast", max_examples=DEFAULT_EXAMPLES // 10)


def examples(count: int) -> int:
    """``count`` under the default profile; under another, in proportion to its
    ``max_examples`` (at least one)."""
    return max(1, count * settings().max_examples // DEFAULT_EXAMPLES)
