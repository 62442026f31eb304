from django.apps import AppConfig


class OperationsConfig(AppConfig):
    name = "operations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # This app's decisions, with its own permission (DESIGN §14): what
        # became of an operation in doubt (its job waits for a person), and
        # clearing a connector pause (a tenant-level decision, no job state).
        from jobs.access import OPERATOR, Decision, register_decision
        from jobs.states import State

        register_decision(Decision("decide_operation", "Decide operation", "operations.decide_operation",
                                   frozenset({OPERATOR}), frozenset({State.NEEDS_ATTENTION, State.WAITING_REVIEW})))
        register_decision(Decision("clear_pause", "Clear connector pause", "operations.decide_operation",
                                   frozenset({OPERATOR}), frozenset()))

        # The review layer's decisions must respect operations: never end
        # a job (resolve, cancel, reject) around an operation in doubt, never
        # correct a request the provider may already hold.
        from review.decisions import register_guard

        from .review import refuse_correction_after_dispatch, refuse_ending_around_doubt

        for ending in ("resolve", "cancel", "reject"):
            register_guard(ending, refuse_ending_around_doubt)
        register_guard("correct", refuse_correction_after_dispatch)

        # Queue health (admin index and `queue_health`) counts operations in doubt.
        from jobs.health import register_health_figure

        from .selectors import operations_in_doubt_count

        register_health_figure("operations_in_doubt", operations_in_doubt_count)

        # Operations take part in the engine's retention sweep, consistency
        # audit and metrics (the engine never imports this app).
        from . import audit, metrics, retention  # noqa: F401
