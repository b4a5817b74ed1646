"""The web app's tabs, one module each, over the shared :class:`~kinegen.apps.service.Service`.

Each module has a ``build(ctx)`` that lays out its tab inside the page's ``gr.Tabs``, wires its own
events and returns a small dataclass with what other tabs need; :func:`kinegen.apps.web.build_app`
composes them and wires the events that cross tabs. :mod:`.common` holds what they share.
"""
