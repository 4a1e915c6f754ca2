"""moto_server with one request at a time (started by scripts/test.sh).

moto's DynamoDB checks a ConditionExpression and then writes, in two steps with
no lock, and moto_server serves every connection on a thread of its own: two
conditional writes to one item that arrive together can both pass. The suite saw
it as two winners of one take (`concurrent_takes_have_exactly_one_winner`, moto
tier: two takes of one row at counter 0 both answered with counter 1). DynamoDB
makes each conditional write atomic, and that is what every lease protocol is
built on, so the suite runs moto with its request handling serialized: the same
moto, the same answers, only never two requests inside it at once. Connections
are still served on threads of their own, and a streamed answer (its body sent
after the handler returns) does not hold the lock.
"""

import sys
import threading

import moto.server


class _Serialized(moto.server.DomainDispatcherApplication):
    _lock = threading.Lock()

    def __call__(self, environ, start_response):  # type: ignore[no-untyped-def]
        with self._lock:
            return super().__call__(environ, start_response)


moto.server.DomainDispatcherApplication = _Serialized  # type: ignore[misc]

if __name__ == "__main__":
    moto.server.main(sys.argv[1:])
