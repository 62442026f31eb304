"""The Content-Security-Policy header (Django 5.2 has none of its own; Django
6's `SECURE_CSP` does the same job)."""

from django.conf import settings


class ContentSecurityPolicyMiddleware:
    """Sends `settings.CONTENT_SECURITY_POLICY` on every response that does
    not set its own (empty: no header). The default policy allows only this
    origin's scripts, styles, images and fonts — no inline script or style,
    no plugins, no framing — which the admin and the console need: their
    JavaScript and CSS are static files."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        policy = settings.CONTENT_SECURITY_POLICY
        if policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = policy
        return response
