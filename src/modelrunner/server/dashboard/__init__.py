"""The web dashboard at /dashboard: static assets from this package and two read-only JSON routes.

The page itself is plain ES modules (static/), no build step. It talks to the daemon's own API with the API
key the user types (kept in the browser's session storage, sent as a bearer token); the page and its assets
need no key (they hold no data: see security.PUBLIC_PATHS), the JSON routes here do.
"""

from modelrunner.server.dashboard.router import CONTENT_SECURITY_POLICY, build_dashboard_router

__all__ = ["CONTENT_SECURITY_POLICY", "build_dashboard_router"]
