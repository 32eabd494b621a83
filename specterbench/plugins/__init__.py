"""The plugin system: hook specifications, the pluggy host (loading, registration, name resolution), the
registration checks, the built-in registrations and the plugin listing.

``hookimpl`` is the marker plugin authors decorate their hooks with (``from specterbench import hookimpl``).
"""

import pluggy

hookimpl = pluggy.HookimplMarker("specterbench")

__all__ = ["hookimpl"]
