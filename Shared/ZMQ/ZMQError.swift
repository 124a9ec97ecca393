import CZMQ
import Glibc

/// A failed libzmq call: which operation, on which endpoint, and the errno it set.
///
/// `EAGAIN` is never thrown: calls that can would-block return `nil` or `false` instead, and
/// `EINTR` is retried inside the wrapper.
public struct ZMQError: Error, Sendable, Equatable, CustomStringConvertible {
    public let errno: Int32
    public let operation: String
    public let endpoint: String?

    public init(errno: Int32, operation: String, endpoint: String? = nil) {
        self.errno = errno
        self.operation = operation
        self.endpoint = endpoint
    }

    /// A stable code for logs and RPC errors, e.g. `zmq.EADDRINUSE`.
    public var code: String { "zmq.\(ZMQError.symbol(for: errno))" }

    public var message: String { String(cString: zmq_strerror(errno)) }

    public var description: String {
        let place = endpoint.map { " \($0)" } ?? ""
        return "\(operation)\(place): \(message) (\(code))"
    }

    /// True when the context is being terminated: the loop owning the socket should stop.
    public var isTerminated: Bool { errno == ETERM }

    static func last(_ operation: String, _ endpoint: String? = nil) -> ZMQError {
        ZMQError(errno: zmq_errno(), operation: operation, endpoint: endpoint)
    }

    private static func symbol(for errno: Int32) -> String {
        switch errno {
        case EINVAL: "EINVAL"
        case EADDRINUSE: "EADDRINUSE"
        case EADDRNOTAVAIL: "EADDRNOTAVAIL"
        case ENOENT: "ENOENT"
        case EACCES: "EACCES"
        case ENAMETOOLONG: "ENAMETOOLONG"
        case EPROTONOSUPPORT: "EPROTONOSUPPORT"
        case ENOTSUP: "ENOTSUP"
        case ETERM: "ETERM"
        case EFSM: "EFSM"
        case EHOSTUNREACH: "EHOSTUNREACH"
        case EMFILE: "EMFILE"
        case ENOTSOCK: "ENOTSOCK"
        case ENOMEM: "ENOMEM"
        case EAGAIN: "EAGAIN"
        case ETIMEDOUT: "ETIMEDOUT"
        default: "E\(errno)"
        }
    }
}
