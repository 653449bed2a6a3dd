"""Where pipelines saved with a mediagen text encoder find its class: their ``model_index.json`` names
the module ``mediagen.models.text_encoders.encoder``. The encoders live in ``mediagen.text.encoders``."""
