"""Every numeric flag of every management command is range-checked by its
parser: "inf", "nan", a negative or absurd value is the
command's usage error naming the flag — nothing runs with it (a
`run_worker --lease-ttl inf` whose every claim fails, `--until-idle` never
exiting; `--poll-interval -1` spinning). One helper reads them all
(`durable.numbers`)."""

import sys

import pytest
from django.core.management import CommandError, load_command_class

from durable.numbers import NumberRefused, finite_number, whole_number

COMMANDS = {  # command → its app
    "run_worker": "jobs", "prune": "jobs", "queue_health": "jobs", "relay_outbox": "jobs", "audit": "jobs",
    "seed_demo": "company", "demo": "company", "bench": "proving", "chaos": "proving",
    "run_provider_simulator": "connectors",
}

REFUSED = [  # (command, flag, a value it must refuse)
    *[("run_worker", "--concurrency", v) for v in ("0", "-1", "1.5", "100000", "²")],
    *[("run_worker", "--lease-ttl", v) for v in ("inf", "nan", "Infinity", "0", "-1", "1e9", "1_0")],
    *[("run_worker", "--grace", v) for v in ("inf", "nan", "-1")],
    *[("run_worker", "--poll-interval", v) for v in ("-1", "0", "inf", "nan")],
    *[("run_worker", "--batch", v) for v in ("0", "100000")],
    *[("run_worker", "--metrics-port", v) for v in ("0", "70000", "-1")],
    *[("prune", "--days", v) for v in ("inf", "nan", "-1")],
    *[("prune", "--redact-after-days", v) for v in ("nan", "-1", "inf")],
    *[("prune", "--batch-size", v) for v in ("0", "1000000000000")],
    *[("prune", "--max-batches", v) for v in ("0", "-1")],
    *[("queue_health", "--max-outbox-age", v) for v in ("inf", "nan", "-5")],
    ("relay_outbox", "--limit", "0"),
    *[("relay_outbox", "--poll-interval", v) for v in ("-1", "0", "nan")],
    *[("audit", "--limit", v) for v in ("0", "-1")],
    *[("seed_demo", "--quotes", v) for v in ("-1", "100000", "nan")],
    ("seed_demo", "--invoices", "-1"),
    *[("demo", "--port", v) for v in ("70000", "-1")],
    *[("bench", flag, "0") for flag in ("--jobs", "--latency-jobs", "--latency-workers", "--claims", "--batch-jobs",
                                        "--repeat", "--claim-tenants")],
    *[("bench", "--rows", v) for v in ("-1", "nan")],
    *[("bench", "--latency-interval", v) for v in ("-1", "nan", "inf")],
    ("bench", "--claim-tenants", "10001"),
    *[("bench", "--processes", v) for v in ("0", "1,x", "1,-2", "1,inf", "1,100000")],
    *[("bench", "--tenants", v) for v in ("10001", "-1")],
    ("bench", "--batches", "-1"),
    *[("bench", "--backlog", v) for v in ("-1", "nan", "10000001")],
    *[("chaos", flag, "0") for flag in ("--jobs", "--workers", "--concurrency")],
    *[("chaos", flag, "-1") for flag in ("--kills", "--cut-connections")],
    *[("chaos", "--stall-after-accept", v) for v in ("-1", "inf", "nan")],
    *[("chaos", flag, v) for flag in ("--stall-probability", "--error-rate", "--throttle-rate")
      for v in ("1.5", "-0.1", "nan")],
    *[("chaos", flag, v) for flag in ("--lease-ttl", "--read-timeout", "--deadline") for v in ("0", "inf", "nan")],
    *[("run_provider_simulator", "--port", v) for v in ("70000", "-1")],
    *[("run_provider_simulator", "--stall-after-accept", v) for v in ("inf", "nan", "-1")],
    *[("run_provider_simulator", flag, v) for flag in ("--stall-probability", "--error-rate", "--throttle-rate")
      for v in ("nan", "1.5")],
    *[("run_provider_simulator", "--retry-after", v) for v in ("-1", "1000000000")],
    *[("run_provider_simulator", "--lookup-stall", v) for v in ("inf", "nan")],
]

ACCEPTED = [  # what the documented uses and the suite pass
    ("run_worker", ["--concurrency", "4", "--lease-ttl", "1.5", "--grace", "0", "--poll-interval", "0.05",
                    "--batch", "100", "--metrics-port", "9100"]),
    ("prune", ["--days", "30", "--redact-after-days", "7.5", "--batch-size", "500", "--max-batches", "1"]),
    ("queue_health", ["--max-outbox-age", "0"]),
    ("relay_outbox", ["--limit", "100", "--poll-interval", "0.2"]),
    ("seed_demo", ["--quotes", "0", "--invoices", "3"]),
    ("bench", ["--processes", "1,2,4", "--tenants", "0", "--batches", "0", "--latency-interval", "0"]),
    ("chaos", ["--stall-probability", "0", "--error-rate", "1", "--lease-ttl", "1.5", "--seed", "17"]),
    ("run_provider_simulator", ["--port", "0", "--stall-after-accept", "10", "--retry-after", "0"]),
]


def parse(command: str, args: list[str]):
    parser = load_command_class(COMMANDS[command], command).create_parser("manage.py", command)
    return parser.parse_args(args)


@pytest.mark.parametrize("command, flag, value", REFUSED)
def test_a_numeric_flag_out_of_its_range_is_the_commands_usage_error(command, flag, value):
    with pytest.raises(CommandError, match=f"argument {flag}: must be"):
        parse(command, [flag, value])


@pytest.mark.parametrize("command, args", ACCEPTED)
def test_the_documented_values_are_accepted(command, args):
    parse(command, args)


@pytest.mark.django_db(transaction=True)
def test_run_worker_with_an_infinite_lease_exits_at_once_with_a_clear_error(manage):
    # Before: accepted, every claim failed and --until-idle never exited.
    result = manage.run("run_worker", "--until-idle", "--lease-ttl", "inf", check=False, timeout=60)
    assert result.returncode == 2
    assert "argument --lease-ttl: must be a finite number" in result.stderr


@pytest.mark.parametrize("text", ["²", "٣", "1_0", " 7", "+7", "0x10", "9" * 20, "9" * 5000, "", "1.0"])
def test_a_whole_number_is_ascii_digits_only(text):
    with pytest.raises(NumberRefused):
        whole_number(text)
    assert whole_number("0") == 0 and whole_number("-3", minimum=-5) == -3 and whole_number(7) == 7


@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "NaN", "Infinity", "1_0", "١", "1e999", "", "0x1p3"])
def test_a_finite_number_is_finite_and_decimal(text):
    with pytest.raises(NumberRefused):
        finite_number(text)
    assert finite_number("1.5") == 1.5 and finite_number(".5") == 0.5 and finite_number("2e3") == 2000.0
    assert finite_number(str(sys.float_info.max)) == sys.float_info.max
