"""A module no job may make the engine import: a Django task's payload that
names it is refused before anything is imported. Importing it leaves a file
at the path in the environment variable IMPORT_ALARM, so a test in another
process can tell."""

import os
from pathlib import Path

if os.environ.get("IMPORT_ALARM"):
    Path(os.environ["IMPORT_ALARM"]).write_text("imported\n")


def not_a_task():
    return "this ran"
