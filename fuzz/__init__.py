"""Python-level fuzz harnesses of the compiled core's bindings, differential against the pure-Python codec.

Each harness module has `one_input(data: bytes)`, which raises AssertionError on a finding and returns otherwise;
`python -m fuzz.run NAME` runs one under atheris, `tests/test_fuzz_python.py` feeds each a few hundred inputs.
"""
