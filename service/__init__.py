"""gln-service: Gated Linear Networks that learn online, served over HTTP.

Build the app with :func:`service.api.app.create_app`; run it with ``python -m service`` (or the
``gln-service`` script), configured by ``GLN_*`` environment variables (:mod:`service.settings`).
"""
