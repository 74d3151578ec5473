"""Each settings field's docstring as its description, read from the module's source in one pass.

pydantic's `use_attribute_docstrings` finds each class's source by walking the interpreter's frames and asking
`inspect.getmodule` of each, which scans every loaded module: 30 of the 50 ms that importing settings.py took
here, for every command that reads the config. `describe` parses the module once with ast and sets the same
descriptions (a string right under a field, cleaned as pydantic cleans it), which `gpudash config show`
prints as the field's comment."""

from __future__ import annotations

import ast
import inspect
import sys
from typing import Any


def describe(*models: Any) -> None:
    """Give each field of `models` (classes of one module) that has no description its docstring."""
    if not models:
        return
    source = inspect.getsource(sys.modules[models[0].__module__])
    classes = {node.name: node for node in ast.parse(source).body if isinstance(node, ast.ClassDef)}
    for model in models:
        if model.__name__ not in classes:  # made by create_model: its fields carry their descriptions
            continue
        body = classes[model.__name__].body
        for field, after in zip(body, body[1:]):
            if (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                info = model.model_fields.get(field.target.id)
                if info is not None and info.description is None:
                    info.description = inspect.cleandoc(after.value.value)
