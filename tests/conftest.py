from parity.subjects import add_subject_modules

# The self-tests' broken subjects join the registry here and in every rank process spawned later.
add_subject_modules("tests.faulty_subjects")


def skip_or_fail(reason: str):
    """A self-test that cannot run says why; under PARITY_STRICT=1 that is a failure, as for cases."""
    import pytest

    from parity.settings import RunSettings

    if RunSettings.from_env().strict:
        pytest.fail(f"strict mode: would skip: {reason}")
    pytest.skip(reason, allow_module_level=True)
