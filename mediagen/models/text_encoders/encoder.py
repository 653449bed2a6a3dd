"""The class path saved pipelines record for ``MediagenTextEncoder`` (see the package docstring)."""

from ...text.encoders.encoder import MediagenTextEncoder

__all__ = ["MediagenTextEncoder"]
