from parity.subjects import add_subject_modules

# The self-tests' broken subjects join the registry here and in every rank process spawned later.
add_subject_modules("tests.faulty_subjects")
