"""Login throttling for the admin (django-axes)."""

from axes.backends import AxesStandaloneBackend


class LoginThrottleBackend(AxesStandaloneBackend):
    """django-axes' lockout check on every login that arrives with a request
    (the admin's login form: a client address to count and lock out).

    An `authenticate()` call without a request — the test client's `login`,
    a script — has no client to throttle; axes would refuse it outright, so
    it passes on to the next backend instead."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username, password, **kwargs)
