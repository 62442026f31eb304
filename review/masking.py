"""Masking a job's sensitive fields for the people who may read the job but
not them (a viewer: `access.sees_sensitive`).

An action declares the payload fields that are sensitive
(`@action(..., sensitive=("to",))`). A `Masker` built for one job and one
reader hides them wherever the job's data is shown: under those names in any
JSON (the payload, a proposal, a correction's before/after, an operation's
request, the history export), and — because an address also turns up in
free text, an error the provider returned, say — every value those fields
hold, wherever it occurs in a text. For a reader who may see them it changes
nothing.
"""

from jobs.actions import action_spec

MASK = "••••••"
# Shorter values are not hunted in free text: masking every "a" would make
# the story unreadable and hide nothing worth hiding.
MIN_TEXT_MATCH = 4


class Masker:
    def __init__(self, fields: frozenset[str], values: set[str]):
        self.fields = fields
        # Longest first, so a value containing another is masked whole.
        self.values = sorted((v for v in values if len(v) >= MIN_TEXT_MATCH), key=len, reverse=True)

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
        """Free text with every sensitive value it quotes masked."""
        if not self.active or not isinstance(text, str):
            return text
        for value in self.values:
            text = text.replace(value, MASK)
        return text


CLEAR = Masker(frozenset(), set())


def _values(fields: frozenset[str], data, found: set[str]) -> None:
    if isinstance(data, dict):
        for key, value in data.items():
            if key in fields and isinstance(value, str):
                found.add(value)
            elif key in fields and isinstance(value, dict):  # a correction's {"before", "after"}
                found.update(v for v in value.values() if isinstance(v, str))
            else:
                _values(fields, value, found)
    elif isinstance(data, list):
        for value in data:
            _values(fields, value, found)


def job_masker(job, *, sees_sensitive: bool, also=()) -> Masker:
    """The masker for one reader of `job`: `CLEAR` when they may see its
    sensitive fields (`access.sees_sensitive`) or its action declares none;
    else one that knows the values to hide, taken from the payload and from
    `also` (other JSON about the job: operation requests, event details, a
    preview's fields as a dict)."""
    spec = action_spec(job.action)
    if sees_sensitive or spec is None or not spec.sensitive:
        return CLEAR
    found: set[str] = set()
    for data in (job.payload, *also):
        _values(spec.sensitive, data, found)
    return Masker(spec.sensitive, found)
