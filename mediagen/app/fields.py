"""Page inputs that hand the raw value to the handlers' checks (``limits.py``).

Gradio checks some inputs itself before a handler runs: a Number with ``precision=0`` rounds 2.5
to 2 without a word and answers "abc" with a conversion error, and a Radio or CheckboxGroup
answers an unknown value with "Value: ... is not in the list of choices", naming no field. These
subclasses skip those checks, so every value reaches the handler, whose one-line error names the
field, the value and what is allowed. They render as the stock components (same front-end).
"""

from __future__ import annotations

import gradio as gr


class RawNumber(gr.Number):
    """A number field whose value reaches the handler as typed (bounded_int / bounded_float judge it)."""

    def get_block_name(self) -> str:
        return "number"

    def preprocess(self, payload):
        return payload


class RawRadio(gr.Radio):
    """A radio group whose value reaches the handler as given (the handler checks it is offered)."""

    def get_block_name(self) -> str:
        return "radio"

    def preprocess(self, payload):
        return payload


class RawCheckboxGroup(gr.CheckboxGroup):
    """A checkbox group whose values reach the handler as given (the handler checks each one)."""

    def get_block_name(self) -> str:
        return "checkboxgroup"

    def preprocess(self, payload):
        return payload
