"""Names the company's parts share: actions, timer subjects and conditions,
and the business keys that make a repeated trigger or proposal harmless."""

QUOTE = "company.quote"
INVOICE = "company.invoice"

SEND_QUOTE = "company.send_quote"
SEND_QUOTE_FOLLOW_UP = "company.send_quote_follow_up"
SEND_INVOICE_REMINDER = "company.send_invoice_reminder"
PLAN_INVOICE_REMINDERS = "company.plan_invoice_reminders"
AGENT_RUN = "company.agent_run"

QUOTE_ANSWERED = "company.quote_answered"
INVOICE_NOT_TO_REMIND = "company.invoice_paid_or_suppressed"


def quote_send_key(number: str) -> str:
    return f"send-quote-{number}"


def quote_follow_up_key(number: str) -> str:
    return f"quote-follow-up-{number}"


def invoice_reminder_key(number: str) -> str:
    """One reminder per invoice: the timer and the agent propose the same key."""
    return f"invoice-reminder-{number}"


def agent_run_key(run: str) -> str:
    return f"agent-rules-{run}"
