from django.apps import AppConfig


class CompanyConfig(AppConfig):
    name = "company"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # This app's decision, with its own permission (DESIGN §14): approving
        # a quote sends its email, so it needs `company.approve_quote` and a
        # reviewer's membership in the quote's tenant (a tenant-level decision:
        # no job state involved).
        from jobs.access import REVIEWER, Decision, register_decision

        register_decision(Decision("approve_quote", "Approve quote", "company.approve_quote",
                                   frozenset({REVIEWER}), frozenset()))
        # The tenant's review policy is the review layer's (due times, four
        # eyes); the reviewers' digest and overdue emails register their actions.
        from review.policy import register_review_policy

        from . import review_notify  # noqa: F401
        from .review_policy import review_terms_for

        register_review_policy(review_terms_for)
