"""Lab 04's attack on the servers themselves: from the judge's children, with the credentials a
step gives them, try to become the judge or a superuser, stop, flush, reconfigure or pause a
server, reach another step's keys, and signal every process in sight.

`SERVER_ATTACK` is step 8's source appended after the reference: its `lag` runs every attempt
and raises `RuntimeError("FIRED:pipeline-servers: <name>:no|DONE ...")`, which the verdict
quotes (proof that the payload ran inside the sandbox). Every attempt must say `no`, and the
servers must go on serving the other steps: such a submission earns every point but step 8's
and the final check's (which requires step 8).
"""

from __future__ import annotations

FIRED = "FIRED:pipeline-servers: "

SERVER_ATTACK = '''
def _attack(conn, r):
    import os, signal
    import psycopg
    said = []

    def tried(name, fn):
        try:
            fn()
            said.append(name + ":DONE")
        except Exception:
            said.append(name + ":no")

    info = conn.info
    for user in ("judge", "postgres", "embedded_postgres"):
        def other(user=user):
            psycopg.connect(host=info.host, port=info.port, dbname="postgres", user=user,
                            password=info.password, connect_timeout=3).close()
        tried("pg-as-" + user, other)
    for name, sql in (("pg-superuser", "ALTER ROLE CURRENT_USER SUPERUSER"),
                      ("pg-createdb", "CREATE DATABASE hostile_db"),
                      ("pg-program", "COPY (SELECT 1) TO PROGRAM 'true'"),
                      ("pg-read-file", "SELECT pg_read_file('postgresql.conf')"),
                      ("pg-terminate", "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                       " WHERE usename <> current_user"),
                      ("pg-reload", "SELECT pg_reload_conf()")):
        def run(sql=sql):
            with psycopg.connect(info.dsn, password=info.password, autocommit=True, connect_timeout=3) as c:
                c.execute(sql)
        tried(name, run)
    for name, args in (("vk-shutdown", ("SHUTDOWN", "NOSAVE")), ("vk-flushall", ("FLUSHALL",)),
                       ("vk-config", ("CONFIG", "SET", "appendonly", "no")), ("vk-debug", ("DEBUG", "SLEEP", "0")),
                       ("vk-client-kill", ("CLIENT", "KILL", "TYPE", "normal")),
                       ("vk-client-pause", ("CLIENT", "PAUSE", "5000")),
                       ("vk-acl", ("ACL", "SETUSER", "default", "on", "nopass", "+@all", "~*")),
                       ("vk-eval", ("EVAL", "return 1", "0")), ("vk-module", ("MODULE", "LIST")),
                       ("vk-other-step", ("SET", "lab:final:orders", "x")), ("vk-keys", ("KEYS", "*"))):
        tried(name, lambda args=args: r.execute_command(*args))
    for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
        if pid != os.getpid():
            for sig in (signal.SIGSTOP, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                    said.append(f"signal-{pid}:DONE")
                except OSError:
                    pass
    return " ".join(said)


def lag(conn, r, stream, group):
    raise RuntimeError(''' + repr(FIRED) + ''' + _attack(conn, r))
'''

ATTEMPTS = ("pg-as-judge", "pg-as-postgres", "pg-as-embedded_postgres", "pg-superuser", "pg-createdb", "pg-program",
            "pg-read-file", "pg-terminate", "pg-reload", "vk-shutdown", "vk-flushall", "vk-config", "vk-debug",
            "vk-client-kill", "vk-client-pause", "vk-acl", "vk-eval", "vk-module", "vk-other-step", "vk-keys")
