from django.apps import AppConfig


class ReviewConfig(AppConfig):
    """Human decisions on jobs (DESIGN §2, §14): decisions, the review
    policy, due times and their escalation, bulk decisions, assignment,
    masking and the job admin. Code only: its records (review deadlines,
    decision batches) and permissions stay in `jobs` with their migrations.
    Depends on `jobs`, which never imports it: it registers into the hooks
    the engine offers."""

    name = "review"

    def ready(self):
        # Review deadlines plan and end with every move into and out of
        # review (`jobs.transitions.on_review_change`); their escalation action
        # is registered with the others.
        from . import due, escalation  # noqa: F401
