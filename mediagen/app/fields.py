"""Page inputs that hand the raw value to the handlers' checks (``limits.py``).

Gradio checks some inputs itself before a handler runs: a Number with ``precision=0`` rounds 2.5
to 2 without a word and answers "abc" with a conversion error, and a Radio or CheckboxGroup
answers an unknown value with "Value: ... is not in the list of choices", naming no field. These
builders return the stock components (same front-end) whose ``preprocess`` passes the value
through, so every value reaches the handler, whose one-line error names the field, the value and
what is allowed. (Stock components with the method replaced on the instance, not subclasses:
Gradio writes a type-stub file next to the module of every component subclass.)
"""

from __future__ import annotations

import gradio as gr


def _raw(component):
    component.preprocess = lambda payload: payload
    return component


def RawNumber(*args, **kwargs) -> gr.Number:
    """A number field whose value reaches the handler as typed (bounded_int / bounded_float judge it)."""
    return _raw(gr.Number(*args, **kwargs))


def RawRadio(*args, **kwargs) -> gr.Radio:
    """A radio group whose value reaches the handler as given (the handler checks it is offered)."""
    return _raw(gr.Radio(*args, **kwargs))


def RawCheckboxGroup(*args, **kwargs) -> gr.CheckboxGroup:
    """A checkbox group whose values reach the handler as given (the handler checks each one)."""
    return _raw(gr.CheckboxGroup(*args, **kwargs))


def RawCheckbox(*args, **kwargs) -> gr.Checkbox:
    """A checkbox whose value reaches the handler as given (the handler checks it is true or false)."""
    return _raw(gr.Checkbox(*args, **kwargs))
