"""The gateway's registrations with the engine: the callback delivery action
and the sweep that finds outcome events (imported at start-up, as every
installed app's `handlers` module is)."""

from . import callbacks  # noqa: F401 - registers gateway.deliver_callback, the sweep and the callback connectors
