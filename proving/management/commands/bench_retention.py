"""`manage.py bench_retention`: retention's speed and its cost to running workers (proving/bench/retention.py)."""

from django.core.management.base import BaseCommand, CommandError

from durable.numbers import whole_flag
from proving.bench import retention as bench_retention
from proving.bench.common import BenchError


class Command(BaseCommand):
    help = ("Retention figures on PostgreSQL: loads --jobs DONE jobs (tenant bench-retention, finished 400 days "
            "ago) with --events history rows each, measures no-op jobs/s through --processes real workers alone, "
            "then again while a real `manage.py prune --days 399` deletes the loaded jobs (with --kept, in a table "
            "that also holds that many jobs finished yesterday, which it must keep); prints jobs/s deleted "
            "and the workers' throughput during it as a ratio of before. Refuses to start when other tenants' "
            "jobs finished more than 399 days ago (the prune would delete them too). Progress on stderr.")

    def add_arguments(self, parser):
        parser.add_argument("--jobs", type=whole_flag(1, 50_000_000), default=300_000,
                            help="Finished jobs loaded for the prune to delete (default 300,000).")
        parser.add_argument("--kept", type=whole_flag(0, 100_000_000), default=0,
                            help="Jobs finished yesterday loaded first, which the prune must keep: the table it "
                                 "works in then holds --jobs + --kept jobs (default 0).")
        parser.add_argument("--events", type=whole_flag(1, 50), default=4,
                            help="History rows per loaded job (default 4).")
        parser.add_argument("--work", type=whole_flag(100, 1_000_000), default=3000,
                            help="No-op jobs per throughput run (default 3,000).")
        parser.add_argument("--processes", type=whole_flag(1, 64), default=2,
                            help="Worker processes (default 2).")
        parser.add_argument("--history", choices=["partitions", "default"], default="partitions",
                            help="Load the history into day partitions (dropped whole; default) or into the "
                                 "default partition (deleted row by row, SQLite's path).")
        parser.add_argument("--prune-args", default="",
                            help="Extra prune options, e.g. \"--pause-ratio 0\" (default none).")

    def handle(self, *args, **opts):
        try:
            lines = bench_retention.run(jobs=opts["jobs"], events=opts["events"], work=opts["work"],
                                        processes=opts["processes"], history=opts["history"],
                                        prune_args=opts["prune_args"].split(), progress=self.stderr.write,
                                        kept=opts["kept"])
        except BenchError as error:
            raise CommandError(str(error)) from error
        self.stdout.write("\n".join(lines))
