"""``mqttamqp-admin``: manage the user store (MQTT, AMQP and console users, their
roles and API tokens); write a self-signed TLS certificate for a quick start
(``gen-cert``).

The user commands work on ``<data>/users.json`` directly, so they run while the
broker runs (the broker re-reads the file when it changes: a new user can connect
at once, a changed password logs out that user's open console sessions).
Passwords are read with ``getpass`` (or one line from standard input with
``--password-stdin``), never from the command line.

``passwd``, ``users`` and ``deluser`` are the earlier spellings of ``user passwd``,
``user list`` and ``user del``: they still work, and ``--help`` does not list them
(one command set in the help and in docs/security.md).
"""

from __future__ import annotations

import argparse
import datetime
import getpass
import ipaddress
import os
import sys
import time

from mqttamqp.console.auth import forget_initial_password
from mqttamqp.security.userstore import (
    ROLE_ADMIN,
    ROLE_CLIENT,
    ROLES,
    UserStore,
    scrypt_line_hash,
    valid_username,
)

__all__ = ["main"]

MIN_PASSWORD = 8
# What --help shows (every command but the hidden ones: test_userstore checks it);
# 'passwd', 'users' and 'deluser' still work, unlisted.
VISIBLE_COMMANDS = ("user", "token", "tokens", "revoke", "gen-cert", "recover")


def _read_password(from_stdin: bool) -> str:
    if from_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    first = getpass.getpass("New password: ")
    second = getpass.getpass("Repeat it: ")
    if first != second:
        raise SystemExit("mqttamqp-admin: the passwords differ; nothing changed")
    return first


def _no_data_dir(store: UserStore) -> None:
    if not os.path.isdir(store.data_dir):
        raise SystemExit(f"mqttamqp-admin: no data directory at {store.data_dir} (give "
                         "the broker's with --data; it is created at the broker's first "
                         "start)")


def _set_password(store: UserStore, args: argparse.Namespace, create: bool | None,
                  role: str | None) -> int:
    if not valid_username(args.user):
        raise SystemExit(f"mqttamqp-admin: invalid user name {args.user!r} "
                         "(letters, digits and ._-@, at most 64)")
    existed = store.get(args.user) is not None
    if create is True and existed:
        raise SystemExit(f"mqttamqp-admin: user {args.user!r} exists; change its password "
                         "with 'user passwd', its role with 'user role'")
    if create is False and not existed:
        raise SystemExit(f"mqttamqp-admin: no user {args.user!r} (add it with 'user add')")
    password = _read_password(args.password_stdin)
    if len(password) < MIN_PASSWORD:
        raise SystemExit(f"mqttamqp-admin: the password must have at least {MIN_PASSWORD} "
                         "characters; nothing changed")
    user = store.set_password(args.user, password, role=None if existed else role)
    forget_initial_password(store.data_dir, args.user)
    print(f"{'changed the password of' if existed else 'created'} user {args.user!r} "
          f"(role {user.role}) in {store.path}")
    return 0


def _passwd(store: UserStore, args: argparse.Namespace) -> int:
    """The earlier ``passwd``: creates a console admin, or changes a password."""
    return _set_password(store, args, None, ROLE_ADMIN)


def _user_add(store: UserStore, args: argparse.Namespace) -> int:
    return _set_password(store, args, True, args.role)


def _user_passwd(store: UserStore, args: argparse.Namespace) -> int:
    return _set_password(store, args, False, None)


def _user_role(store: UserStore, args: argparse.Namespace) -> int:
    try:
        store.set_role(args.user, args.role)
    except KeyError:
        raise SystemExit(f"mqttamqp-admin: no user {args.user!r}") from None
    print(f"user {args.user!r} now has the role {args.role}")
    return 0


def _users(store: UserStore, args: argparse.Namespace) -> int:
    _no_data_dir(store)
    if not store.users():
        print(f"no users in {store.path} (the broker creates 'admin' at its first start)",
              file=sys.stderr)
    for user in sorted(store.users().values(), key=lambda u: u.name):
        changed = time.strftime("%Y-%m-%d %H:%M", time.gmtime(user.changed))
        print(f"{user.name}\t{user.role}\tpassword set {changed} UTC\t"
              f"{len(user.tokens)} API token(s)")
    return 0


def _deluser(store: UserStore, args: argparse.Namespace) -> int:
    if not store.delete_user(args.user):
        raise SystemExit(f"mqttamqp-admin: no user {args.user!r}")
    print(f"deleted user {args.user!r}")
    return 0


def _user_import(store: UserStore, args: argparse.Namespace) -> int:
    """Copy a ``--users`` file (one ``user:scrypt$...`` per line) into the store."""
    from mqttamqp.security.users import read_lines

    added = skipped = 0
    try:
        lines = list(read_lines(args.file))
    except OSError as exc:
        raise SystemExit(f"mqttamqp-admin: cannot read {args.file}: {exc.strerror}") from None
    for number, record in lines:
        if isinstance(record, ValueError):
            print(f"{args.file}:{number}: skipped: {record}", file=sys.stderr)
            skipped += 1
            continue
        if not valid_username(record.username):
            print(f"{args.file}:{number}: skipped: invalid user name {record.username!r}",
                  file=sys.stderr)
            skipped += 1
        elif store.put_hashed(record.username, scrypt_line_hash(record), args.role):
            added += 1
        else:
            print(f"{args.file}:{number}: skipped: user {record.username!r} exists",
                  file=sys.stderr)
            skipped += 1
    print(f"imported {added} user(s) (role {args.role}) into {store.path}; {skipped} "
          "skipped. The --users option is no longer needed for them.")
    return 0 if added or not skipped else 1


def _token(store: UserStore, args: argparse.Namespace) -> int:
    try:
        token = store.create_token(args.user, args.label, args.read_only)
    except KeyError:
        raise SystemExit(f"mqttamqp-admin: no user {args.user!r}") from None
    print(token)
    print("(shown once; send it as 'Authorization: Bearer <token>' to /api/...)",
          file=sys.stderr)
    return 0


def _tokens(store: UserStore, args: argparse.Namespace) -> int:
    user = store.get(args.user)
    if user is None:
        raise SystemExit(f"mqttamqp-admin: no user {args.user!r}")
    for t in user.tokens:
        created = time.strftime("%Y-%m-%d %H:%M", time.gmtime(t.created))
        mode = "read-only" if t.read_only else "read-write"
        print(f"{t.id}\t{mode}\tcreated {created} UTC\t{t.label}")
    return 0


def _revoke(store: UserStore, args: argparse.Namespace) -> int:
    if not store.revoke_token(args.user, args.token_id):
        raise SystemExit(f"mqttamqp-admin: user {args.user!r} has no token {args.token_id!r}")
    print(f"revoked token {args.token_id} of {args.user!r}")
    return 0


CERT_DAYS = 825


def _self_signed(host: str) -> tuple[bytes, bytes]:
    """A new EC P-256 key and a self-signed certificate for ``host`` (PEM each):
    ``host`` in the subjectAltName, and 127.0.0.1 too when ``host`` is an IP address
    or localhost."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        names.append(x509.DNSName(host))
        loopback = host.lower() == "localhost"
    else:
        names.append(x509.IPAddress(address))
        loopback = True
    local = ipaddress.ip_address("127.0.0.1")
    if loopback and x509.IPAddress(local) not in names:
        names.append(x509.IPAddress(local))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "mqttamqp")])
    now = datetime.datetime.now(datetime.UTC)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=False,
            crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        # (client auth too: it is also a bridge's client certificate, cert-file)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski),
                       critical=False)
        .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return key_pem, certificate.public_bytes(serialization.Encoding.PEM)


def _gen_cert(store: UserStore, args: argparse.Namespace) -> int:
    host = args.host.strip()
    if not host or any(c.isspace() for c in host):
        raise SystemExit(f"mqttamqp-admin: invalid host name {args.host!r}")
    directory = os.path.join(store.data_dir, "tls")
    key_path = os.path.join(directory, "server.key")
    cert_path = os.path.join(directory, "server.crt")
    existing = [p for p in (key_path, cert_path) if os.path.lexists(p)]
    if existing and not args.force:
        raise SystemExit(f"mqttamqp-admin: {existing[0]} exists; nothing written "
                         "(--force replaces it)")
    key_pem, cert_pem = _self_signed(host)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    # The key is written to a new file created with mode 0600 (never readable by
    # others, not even for a moment), then renamed into place.
    for path, data, mode in ((key_path, key_pem, 0o600), (cert_path, cert_pem, 0o644)):
        temporary = f"{path}.tmp-{os.getpid()}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            os.fchmod(fd, mode)  # whatever the umask
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    print(f"wrote {cert_path} and {key_path} (self-signed for {host}, valid "
          f"{CERT_DAYS} days); listen with e.g.\n"
          f"  --mqtt ssl:8883:privateKey={key_path}:certKey={cert_path}\n"
          f"and give clients {cert_path} as their CA certificate")
    return 0


def _recover(store: UserStore, args: argparse.Namespace) -> int:
    """Cut a damaged storage file after its last good transaction, keeping a copy
    (refused while a broker runs on the data directory)."""
    from mqttamqp.datadir import StorageBusy, recover

    if args.file:   # a --storage file://PATH outside the data directory
        data_dir, filename = os.path.split(os.path.abspath(args.file))
    else:
        data_dir = os.path.abspath(args.data_dir or args.data)
        filename = "mqttamqp.fs"   # (mqttamqp.store.FILENAME, without importing ZODB)
    try:
        done = recover(data_dir, filename)
    except StorageBusy as busy:
        raise SystemExit(f"mqttamqp-admin: {data_dir} is in use (lock held by {busy}); "
                         "stop the broker first; nothing changed") from None
    except (OSError, ValueError) as exc:
        raise SystemExit(f"mqttamqp-admin: cannot recover {data_dir}: {exc}") from None
    last = f" (the last from {done.last_transaction})" if done.last_transaction else ""
    if done.backup is None:
        print(f"{done.path}: no damaged transaction found{last}; nothing changed")
        return 0
    print(f"{done.path}: kept {done.kept:,} of {done.size:,} bytes, every transaction "
          f"before the first damaged one{last}; removed {done.removed:,} bytes. The whole "
          f"file as it was is in {done.backup}. The broker can start again.")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mqttamqp-admin",
        description="Manage mqttamqp's users (MQTT, AMQP and the console) and API "
        "tokens; write a TLS certificate.")
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="{" + ",".join(VISIBLE_COMMANDS) + "}")

    def command(name: str, help: str, hidden: bool = False) -> argparse.ArgumentParser:
        # A hidden command (an earlier spelling) gets no help line: argparse lists
        # only the commands added with help=, and the metavar names the rest.
        if hidden:
            p = sub.add_parser(name, description=help)
        else:
            p = sub.add_parser(name, help=help, description=help)
        p.add_argument("--data", "-d", default="mqttamqp-data",
                       help="the broker's data directory (default: mqttamqp-data)")
        return p

    users = sub.add_parser("user", help="manage users: add, del, passwd, role, list, import",
                           description="Manage the user store DATA/users.json: MQTT and "
                           "AMQP clients and console users, by role (admin: the console "
                           "with actions; read-only: the console without; client: MQTT "
                           "and AMQP only). Changes apply at once, also while the broker "
                           "runs.")
    user_sub = users.add_subparsers(dest="user_command", required=True)

    def user_command(name: str, help: str) -> argparse.ArgumentParser:
        p = user_sub.add_parser(name, help=help, description=help)
        p.add_argument("--data", "-d", default="mqttamqp-data",
                       help="the broker's data directory (default: mqttamqp-data)")
        return p

    p = user_command("add", "add a user (the password is asked for)")
    p.add_argument("user")
    p.add_argument("--role", choices=ROLES, default=ROLE_CLIENT,
                   help="admin, read-only or client (default: client)")
    p.add_argument("--password-stdin", action="store_true",
                   help="read the password as one line from standard input")
    p.set_defaults(run=_user_add)
    p = user_command("passwd", "change a user's password")
    p.add_argument("user")
    p.add_argument("--password-stdin", action="store_true",
                   help="read the new password as one line from standard input")
    p.set_defaults(run=_user_passwd)
    p = user_command("role", "change a user's role")
    p.add_argument("user")
    p.add_argument("role", choices=ROLES)
    p.set_defaults(run=_user_role)
    p = user_command("del", "delete a user")
    p.add_argument("user")
    p.set_defaults(run=_deluser)
    p = user_command("list", "list the users with their roles")
    p.set_defaults(run=_users)
    p = user_command("import", "copy the users of a --users file (user:scrypt$... lines) "
                     "into the store")
    p.add_argument("file")
    p.add_argument("--role", choices=ROLES, default=ROLE_CLIENT,
                   help="the role they get (default: client)")
    p.set_defaults(run=_user_import)

    # The earlier spellings, hidden from --help: 'user passwd' / 'user add --role
    # admin', 'user list' and 'user del' replace them.
    p = command("passwd", "set a user's password, creating a console admin if new "
                "(an earlier spelling of 'user add --role admin' / 'user passwd')",
                hidden=True)
    p.add_argument("user")
    p.add_argument("--password-stdin", action="store_true",
                   help="read the new password as one line from standard input")
    p.set_defaults(run=_passwd)
    p = command("users", "list the users (an earlier spelling of 'user list')", hidden=True)
    p.set_defaults(run=_users)
    p = command("deluser", "delete a user (an earlier spelling of 'user del')", hidden=True)
    p.add_argument("user")
    p.set_defaults(run=_deluser)
    p = command("token", "create an API token (printed once) for the JSON API")
    p.add_argument("user")
    p.add_argument("--label", default="", help="a note saying what the token is for")
    p.add_argument("--read-only", action="store_true",
                   help="the token may read but not act (POSTs get 403)")
    p.set_defaults(run=_token)
    p = command("tokens", "list a user's API tokens")
    p.add_argument("user")
    p.set_defaults(run=_tokens)
    p = command("revoke", "revoke an API token")
    p.add_argument("user")
    p.add_argument("token_id")
    p.set_defaults(run=_revoke)
    p = command("gen-cert", "write a self-signed TLS certificate and its key for a quick "
                "start: DATA/tls/server.crt and DATA/tls/server.key (mode 0600)")
    p.add_argument("--host", required=True,
                   help="the name (or IP address) clients connect to; it goes into the "
                   "certificate's subjectAltName, with 127.0.0.1 when it is an IP "
                   "address or localhost")
    p.add_argument("--force", action="store_true",
                   help="replace an existing server.crt/server.key")
    p.set_defaults(run=_gen_cert)
    p = command("recover", "repair a storage file the broker refuses to open as damaged "
                "(a commit torn by a crash): copy DATA/mqttamqp.fs to "
                "mqttamqp.fs.damaged-<time>, then cut it after its last good transaction. "
                "Refused while the broker runs")
    p.add_argument("data_dir", nargs="?", metavar="DATA",
                   help="the data directory (instead of --data)")
    p.add_argument("--file", metavar="PATH",
                   help="the storage file itself, when --storage file://PATH put it "
                   "outside the data directory")
    p.set_defaults(run=_recover)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        store = UserStore(os.path.abspath(args.data))
        result: int = args.run(store, args)
    except ValueError as exc:   # a users.json edited by hand that does not parse
        raise SystemExit(f"mqttamqp-admin: {exc}") from None
    return result


if __name__ == "__main__":
    sys.exit(main())
