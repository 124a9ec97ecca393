import CZMQ
import Glibc

/// A libzmq context. libzmq contexts are thread-safe, so this is `Sendable`; sockets are not.
public final class ZMQContext: @unchecked Sendable {
    let handle: UnsafeMutableRawPointer

    public init() {
        // zmq_ctx_new fails only when the process is out of file descriptors or memory.
        guard let handle = zmq_ctx_new() else {
            fatalError("zmq_ctx_new failed: \(ZMQError.last("zmq_ctx_new"))")
        }
        self.handle = handle
    }

    /// Makes every blocking call on this context's sockets return ETERM, so loops can stop.
    public func shutdown() {
        zmq_ctx_shutdown(handle)
    }

    deinit {
        // Every socket holds a strong reference to its context, so all are closed by now.
        while zmq_ctx_term(handle) != 0 && zmq_errno() == EINTR {}
    }

    /// Whether this libzmq was built with CURVE security (Debian's is, through libsodium).
    public static var hasCurve: Bool { zmq_has("curve") != 0 }
}

/// A CURVE key pair in Z85 text (40 characters each).
public struct CurveKeyPair: Sendable, Equatable {
    public let publicKey: String
    public let secretKey: String

    public init(publicKey: String, secretKey: String) {
        self.publicKey = publicKey
        self.secretKey = secretKey
    }

    /// The 32 bytes a Z85 key stands for, as ZAP presents client keys; nil if it is not Z85.
    public static func decode(z85 key: String) -> [UInt8]? {
        guard key.utf8.count == 40 else { return nil }
        var bytes = [UInt8](repeating: 0, count: 32)
        let ok = key.withCString { zmq_z85_decode(&bytes, $0) } != nil
        return ok ? bytes : nil
    }

    public static func generate() throws(ZMQError) -> CurveKeyPair {
        var publicKey = [CChar](repeating: 0, count: 41)
        var secretKey = [CChar](repeating: 0, count: 41)
        guard zmq_curve_keypair(&publicKey, &secretKey) == 0 else {
            throw ZMQError.last("zmq_curve_keypair")
        }
        return CurveKeyPair(
            publicKey: String(decoding: publicKey.prefix(40).map { UInt8(bitPattern: $0) }, as: UTF8.self),
            secretKey: String(decoding: secretKey.prefix(40).map { UInt8(bitPattern: $0) }, as: UTF8.self)
        )
    }
}
