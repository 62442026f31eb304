"""Actions of the demo story (the business app grows here)."""

from jobs.actions import Wait, action


@action("demo.await_reply")
def await_reply(ctx):
    """Ask the customer, then wait for the reply without holding a worker."""
    if ctx.job.attempts == 1:
        return Wait.external("waiting for the customer's reply to the quote")
    return {"reply_received": True}
