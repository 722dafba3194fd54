"""The contract kit: checks every plugin of a kind must pass, as a pytest plugin.

`dllmbench.testing.doubles` holds small deterministic plugins to run them on;
`dllmbench.testing.contracts` holds the checks; `dllmbench.testing.pytest_plugin` is the
pytest entry point that parametrises them over every registered plugin.
"""
