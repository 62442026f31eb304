"""Masking a job's sensitive fields for the people who may read the job but
not them (a viewer: `access.sees_sensitive`).

An action declares the payload fields that are sensitive
(`@action(..., sensitive=("to",))`). A `Masker` built for one job and one
reader hides them wherever the job's data is shown: under those names in any
JSON (the payload, a proposal, a correction's before/after, an operation's
request, the history export), and — because an address also turns up in
free text, an error the provider returned, a reviewer's note, say — every
value those fields ever held, wherever it occurs in a text, in any letter
case, and each address or word of a longer value on its own (an error
quotes "ana@example.com" of "Ana Smith <ana@example.com>"). For a reader who
may see them it changes nothing.

`job_masker` is the one way to build it: every page, list, export and
admin page of a job, its operations and its proposal reads through it.
"""

import re

from jobs.actions import action_spec
from jobs.models import JobEvent

MASK = "••••••"
# Shorter values are not hunted in free text: masking every "a" would make
# the story unreadable and hide nothing worth hiding.
MIN_TEXT_MATCH = 4
# The history rows whose details hold values a sensitive field had: the
# proposal as made (`enqueue`) and each correction's before/after. Bounded:
# a job has a few.
_HISTORY_KINDS = ("enqueue", "correct")
_HISTORY_LIMIT = 200
# What separates the parts of a longer value (a name and its address, a list).
_PARTS = re.compile(r"[\s,;<>()\"'\[\]]+")


class Masker:
    def __init__(self, fields: frozenset[str], values: set[str]):
        self.fields = fields
        hunted = set()
        for value in values:
            hunted.add(value)
            hunted.update(_PARTS.split(value))
        # Longest first, so a value containing another is masked whole.
        self.values = sorted((v for v in hunted if len(v) >= MIN_TEXT_MATCH), key=len, reverse=True)
        self._pattern = (re.compile("|".join(map(re.escape, self.values)), re.IGNORECASE)
                         if self.values else None)

    @property
    def active(self) -> bool:
        return bool(self.fields)

    def field(self, name: str, value):
        """`value` of field `name` as the reader may see it."""
        if name in self.fields and value not in (None, ""):
            return MASK
        return self.data(value)

    def data(self, value):
        """A JSON value with the sensitive fields masked at any depth."""
        if not self.active:
            return value
        if isinstance(value, dict):
            return {k: self.field(k, v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.data(v) for v in value]
        if isinstance(value, str):
            return self.text(value)
        return value

    def text(self, text):
        """Free text with every sensitive value it quotes masked, in any letter case."""
        if not self.active or not isinstance(text, str) or self._pattern is None:
            return text
        return self._pattern.sub(MASK, text)


CLEAR = Masker(frozenset(), set())


def _strings(value, found: set[str]) -> None:
    if isinstance(value, str):
        found.add(value)
    elif isinstance(value, dict):  # a correction's {"before", "after"}
        for inner in value.values():
            _strings(inner, found)
    elif isinstance(value, list):
        for inner in value:
            _strings(inner, found)


def _values(fields: frozenset[str], data, found: set[str]) -> None:
    if isinstance(data, dict):
        for key, value in data.items():
            if key in fields:
                _strings(value, found)
            else:
                _values(fields, value, found)
    elif isinstance(data, list):
        for value in data:
            _values(fields, value, found)


def job_masker(job, *, sees_sensitive: bool, also=()) -> Masker:
    """The masker for one reader of `job`: `CLEAR` when they may see its
    sensitive fields (`access.sees_sensitive`) or its action declares none;
    else one that knows every value to hide: the payload's, the values its
    history recorded (the proposal as made, each correction's replaced and
    new values: a provider error may quote an address a reviewer has since
    corrected) and those in `also` (other JSON about the job: operation
    requests, a preview's fields as a dict). `job` may be unsaved (a
    proposal's action and payload): then only those and `also` count."""
    spec = action_spec(job.action)
    if sees_sensitive or spec is None or not spec.sensitive:
        return CLEAR
    history = []
    if getattr(job, "pk", None) is not None:
        history = list(JobEvent.objects.filter(job_id=job.pk, kind__in=_HISTORY_KINDS)
                       .values_list("detail", flat=True)[:_HISTORY_LIMIT])
    found: set[str] = set()
    for data in (job.payload, *history, *also):
        _values(spec.sensitive, data, found)
    return Masker(spec.sensitive, found)
