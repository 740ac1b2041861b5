"""A type check of infra/ against Azure's own resource types: what `az bicep build` / ARM would reject.

No Bicep compiler can run here, so this reads the templates with the real Bicep grammar
(tests/infra/bicep.py) and checks them against the type definitions the compiler itself uses
(tests/infra/armtypes.py, vendored from Azure/bicep-types-az).

Covered, for every ``resource`` and ``existing`` declaration of every file (nested ``outer::inner``
declarations, ``parent:`` children, ``[for ...]`` loops and ``if (...)`` conditions included):

- the type exists and the API version exists for it (index.json), and its type data is vendored;
- every property set exists at that level (a typo or a wrong nesting level fails), in the exact case;
- no read-only property is set; every required property of a literal object is present;
- literal values: type (string/int/bool/object/array), closed sets (literal unions, discriminators, and
  the "Allowed Values: ..." lists the type data states in a description), min/max length and value,
  patterns; extensible enums (known literals + any string) accept only their known literals;
- values that are not literals but whose type is known: parameters (declared type, @allowed,
  @minLength...), variables (checked as their value), interpolated strings (always strings), the two
  branches of ``c ? a : b``, function results (``guid()`` is a string, ``length()`` an int, ...), module
  outputs (their declared type) and properties read from resources (their type in the type data);
- ``parent:`` names a resource of the parent type; a child's ``name`` has the right number of segments;
  ``scope:`` only on extension and ``existing`` resources; ``dependsOn`` names resources or modules;
- every read ``x.properties.a.b`` / ``x[i].name`` / ``x::y.id`` of a resource names a real, readable
  property; every ``m.outputs.o`` names an output of module ``m``; every ``v['key']`` of a JSON/object
  variable names a key it has;
- module calls pass only parameters the module declares, every required one, with matching types;
  outputs, parameter defaults, @allowed lists and main.parameters.json match their declared types.

Skipped, and listed in the report with the reason: values whose type cannot be known statically (loop
variables, members of object parameters, ``any()``, results of functions whose type depends on data) and
checks a non-literal cannot satisfy (a pattern, a length, or a closed set that a string parameter without
@allowed feeds).

The parts, one module each: ``static_types`` (what an expression is known to be), ``findings`` (where
a value sits, the report's errors and skips), ``inference`` (the static type of an expression, reads of
resources, module outputs and variables included), ``value_check`` (a value against a node of Azure's type
data) and ``declarations`` (every resource, module, parameter and output of a file, the parameter file, and
``type_check``, the entry point).
"""
