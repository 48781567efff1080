"""parity.settings.RunSettings: the one reader of the PARITY_* variables, and what it hands on."""
from parity.settings import RunSettings


def test_from_env_reads_every_variable_and_options_go_on_top():
    env = {"PARITY_STRICT": "yes", "PARITY_CASES_DIR": "/c",
           "PARITY_SUBJECT_MODULES": "a.b,c", "PARITY_MUTANT": " ce_local_max ", "PARITY_TRACE_COLLECTIVES": "1"}
    s = RunSettings.from_env(env)
    assert (s.strict, s.cases_dir, s.subject_modules, s.mutant, s.trace_collectives) == \
        (True, "/c", ("a.b", "c"), "ce_local_max", True)
    assert RunSettings.from_env({}) == RunSettings()
    assert RunSettings.from_env({"PARITY_STRICT": "0"}, timeout_s=5.0).timeout_s == 5.0
    assert not RunSettings.from_env({"PARITY_STRICT": "0"}).strict
    assert RunSettings.from_env(env, strict=False).strict is False


def test_what_ranks_and_reproducers_are_given():
    s = RunSettings(mutant="ce_local_max", subject_modules=("tests.faulty_subjects",))
    assert s.rank_environ({"PATH": "/bin", "PARITY_MUTANT": "other"}) == {"PATH": "/bin", "PARITY_MUTANT": "ce_local_max"}
    assert RunSettings().rank_environ({"PATH": "/bin", "PARITY_MUTANT": "other"}) == {"PATH": "/bin"}
    assert s.repro_env() == {"PARITY_SUBJECT_MODULES": "tests.faulty_subjects", "PARITY_MUTANT": "ce_local_max"}
    assert RunSettings(**s.as_dict()) == s  # what a job process is started with
