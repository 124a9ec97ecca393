import CDrivebusSupport
import CMosquitto
import Foundation
import Synchronization

/// One MQTT message, received or to publish.
public struct MQTTMessage: Sendable, Equatable {
    public var topic: String
    public var payload: [UInt8]
    public var qos: Int32
    public var retain: Bool

    public init(topic: String, payload: [UInt8], qos: Int32 = 0, retain: Bool = false) {
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
    }

    public init(topic: String, text: String, qos: Int32 = 0, retain: Bool = false) {
        self.init(topic: topic, payload: Array(text.utf8), qos: qos, retain: retain)
    }
}

public struct MQTTError: Error, Sendable, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }

    static func library(_ rc: Int32, _ what: String) -> MQTTError {
        MQTTError("\(what): \(String(cString: mosquitto_strerror(rc)))")
    }
}

/// An MQTT v5 client on libmosquitto, with its own thread.
///
/// Once set up, every libmosquitto call happens on that thread, which waits in `poll` on the
/// broker's socket and on an eventfd that `publish` and `shutdown` signal, so nothing blocks the
/// cooperative pool.
/// The thread drives libmosquitto's loop by hand (read, hand over, write) so that a QoS 1 message
/// is acknowledged only after `receive` has returned: libmosquitto queues each PUBACK while it
/// reads, and the queue is written after the handler has made the messages durable. A crash in
/// between leaves them unacknowledged, and the broker delivers them again.
public final class MQTTClient: Sendable {
    public struct Configuration: Sendable {
        public struct TLS: Sendable, Equatable {
            /// PEM file of the CA that signed the broker's certificate; the system's CAs when nil.
            public var caFile: String?
            /// A client certificate and its key, for brokers that require one.
            public var certFile: String?
            public var keyFile: String?

            public init(caFile: String? = nil, certFile: String? = nil, keyFile: String? = nil) {
                self.caFile = caFile
                self.certFile = certFile
                self.keyFile = keyFile
            }
        }

        public struct Subscription: Sendable, Equatable {
            public var filter: String
            public var qos: Int32
            public init(_ filter: String, qos: Int32 = 1) {
                self.filter = filter
                self.qos = qos
            }
        }

        public var host: String
        public var port: Int
        public var clientID: String
        /// Keep the session across disconnects, so the broker holds QoS 1 messages meanwhile.
        public var persistentSession = true
        public var keepAliveS = 30
        public var username: String?
        /// Never logged.
        public var password: String?
        public var tls: TLS?
        /// Published by the broker when the connection drops without a DISCONNECT.
        public var will: MQTTMessage?
        /// QoS 0 or 1: with QoS 2 libmosquitto acknowledges (PUBREC) before handing a message over.
        public var subscriptions: [Subscription] = []
        /// How many unacknowledged QoS 1 messages the broker may send at once.
        public var receiveMaximum = 1000
        /// Reading stops once this many messages are waiting for `receive` (one read may take a
        /// few more).
        public var maxBatch = 1000
        /// The broker sends nothing larger (MQTT v5 maximum packet size); what it would is dropped
        /// there, unseen.
        public var maxPacketBytes = 16 << 20
        /// Messages waiting for a connection beyond this are dropped, oldest first.
        public var maxPendingPublishes = 10_000
        public var reconnectDelayS: ClosedRange<Double> = 0.1...10

        public init(host: String, port: Int, clientID: String) {
            self.host = host
            self.port = port
            self.clientID = clientID
        }
    }

    public enum Event: Sendable, Equatable {
        case connected(sessionPresent: Bool)
        /// The connection was refused or lost; the client tries again after a delay.
        case disconnected(reason: String)
        /// The broker refused a subscription (its reason code, 0x80 or more), or granted less
        /// than the QoS asked for.
        case subscriptionRefused(filter: String, granted: Int32)
        /// libmosquitto refused a message for good (a wildcard in its topic, too large, a QoS the
        /// broker does not take); it is dropped and counted.
        case publishRefused(topic: String, reason: String)
    }

    /// Called on the client's thread with the messages read in one go, and whether `shutdown`
    /// has been called (for a handler that waits for storage). Their acknowledgements are written
    /// after it returns `true`; `false` (when shutting down with messages that are not yet
    /// durable) stops the client for good, closing the connection without acknowledging them or
    /// publishing anything more.
    public typealias Receive = @Sendable (_ messages: [MQTTMessage], _ isStopping: @Sendable () -> Bool) -> Bool

    private struct Shared {
        var outbox: [MQTTMessage] = []
        var stopping = false
        var finals: [MQTTMessage] = []
        var connected = false
        var dropped = 0
        var published = 0
        var exitWaiters: [@Sendable () -> Void] = []
        var exited = false
    }

    public let configuration: Configuration
    private let receive: Receive
    private let onEvent: @Sendable (Event) -> Void
    private let shared = Mutex(Shared())
    private let wakeFD: Int32

    private static let libraryReady: Bool = { mosquitto_lib_init() == MOSQ_ERR_SUCCESS.rawValue }()

    /// Starts the client's thread, which connects and stays connected until `shutdown`.
    public init(_ configuration: Configuration, onEvent: @escaping @Sendable (Event) -> Void = { _ in }, receive: @escaping Receive = { _, _ in true }) throws(MQTTError) {
        guard Self.libraryReady else { throw MQTTError("libmosquitto could not be initialised") }
        guard configuration.subscriptions.allSatisfy({ (0...1).contains($0.qos) }) else {
            throw MQTTError("subscriptions take QoS 0 or 1: with QoS 2 a message is acknowledged before it is stored")
        }
        self.configuration = configuration
        self.receive = receive
        self.onEvent = onEvent
        let fd = drivebus_eventfd()
        guard fd >= 0 else { throw MQTTError("eventfd: \(String(cString: strerror(errno)))") }
        wakeFD = fd
        let connection = try Connection(configuration)
        let thread = Thread { [self, clientID = configuration.clientID] in
            _ = drivebus_thread_name("mqtt-\(clientID)")
            run(connection)
        }
        thread.start()
    }

    deinit { close(wakeFD) }

    public var isConnected: Bool { shared.withLock { $0.connected } }
    /// True once `shutdown` was called: a `receive` that waits for storage should give up.
    public var isStopping: Bool { shared.withLock { $0.stopping } }
    /// Messages handed to libmosquitto, and messages dropped while no connection was there.
    public var counts: (published: Int, dropped: Int) { shared.withLock { ($0.published, $0.dropped) } }

    /// Queues a message; it is sent as soon as the client is connected.
    public func publish(_ message: MQTTMessage) { publish([message]) }

    public func publish(_ messages: [MQTTMessage]) {
        guard !messages.isEmpty else { return }
        shared.withLock { state in
            state.outbox += messages
            let excess = state.outbox.count - configuration.maxPendingPublishes
            if excess > 0 {
                state.outbox.removeFirst(excess)
                state.dropped += excess
            }
        }
        _ = drivebus_eventfd_signal(wakeFD)
    }

    /// Publishes `finals` (such as an "offline" status), disconnects cleanly and stops the thread.
    /// Returns once the thread has exited.
    public func shutdown(publishing finals: [MQTTMessage] = []) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let done = shared.withLock { state -> Bool in
                state.stopping = true
                state.finals = finals
                if state.exited { return true }
                state.exitWaiters.append { continuation.resume() }
                return false
            }
            _ = drivebus_eventfd_signal(wakeFD)
            if done { continuation.resume() }
        }
    }

    // MARK: The client's thread

    private func run(_ connection: Connection) {
        var delay = configuration.reconnectDelayS.lowerBound
        // When the connection came up: the backoff starts again only after one that lasted. A
        // broker that takes the session away at once (another client with the same id) would
        // otherwise be reconnected to ten times a second, each with a full announcement.
        var connectedAt: ContinuousClock.Instant?
        var abandoned = false
        loop: while !isStopping {
            guard connection.hasSocket else {
                if let failure = connection.open() {
                    onEvent(.disconnected(reason: failure))
                    waitForWake(timeoutS: delay)
                    delay = min(delay * 2, configuration.reconnectDelayS.upperBound)
                }
                continue
            }
            let socket = mosquitto_socket(connection.handle)
            var fds = [
                pollfd(fd: socket, events: Int16(POLLIN) | (mosquitto_want_write(connection.handle) ? Int16(POLLOUT) : 0), revents: 0),
                pollfd(fd: wakeFD, events: Int16(POLLIN), revents: 0),
            ]
            _ = poll(&fds, 2, 1000)
            var rc = MOSQ_ERR_SUCCESS.rawValue
            if fds[0].revents & Int16(POLLIN | POLLERR | POLLHUP) != 0 {
                var reads = 0
                repeat {
                    rc = mosquitto_loop_read(connection.handle, 1)
                    reads += 1
                } while rc == MOSQ_ERR_SUCCESS.rawValue && connection.received.count < configuration.maxBatch && reads < 4 * configuration.maxBatch
                    && Self.isReadable(mosquitto_socket(connection.handle))
            }
            if !connection.received.isEmpty {
                let batch = connection.received
                connection.received = []
                if !receive(batch, { [self] in isStopping }) {
                    abandoned = true
                    break loop
                }
            }
            for event in connection.takeEvents() {
                if case .connected = event {
                    connectedAt = .now
                    shared.withLock { $0.connected = true }
                }
                onEvent(event)
            }
            _ = drivebus_eventfd_drain(wakeFD)
            if rc == MOSQ_ERR_SUCCESS.rawValue && connection.isConnected { rc = send(shared.withLock { Self.take(&$0.outbox) }, on: connection) }
            if rc == MOSQ_ERR_SUCCESS.rawValue && mosquitto_want_write(connection.handle) { rc = mosquitto_loop_write(connection.handle, 1) }
            if rc == MOSQ_ERR_SUCCESS.rawValue { rc = mosquitto_loop_misc(connection.handle) }
            if rc != MOSQ_ERR_SUCCESS.rawValue {
                let reason = connection.failure ?? String(cString: mosquitto_strerror(rc))
                connection.lost()
                shared.withLock { $0.connected = false }
                onEvent(.disconnected(reason: reason))
                if let since = connectedAt, since.duration(to: .now) >= Self.stableConnection { delay = configuration.reconnectDelayS.lowerBound }
                connectedAt = nil
                waitForWake(timeoutS: delay)
                delay = min(delay * 2, configuration.reconnectDelayS.upperBound)
            }
        }
        if !abandoned && connection.isConnected {
            // A clean goodbye: what is queued, the finals, then DISCONNECT, written within a second.
            _ = send(shared.withLock { Self.take(&$0.outbox) + $0.finals }, on: connection)
            mosquitto_disconnect(connection.handle)
            let deadline = ContinuousClock.now + .seconds(1)
            while mosquitto_want_write(connection.handle) && ContinuousClock.now < deadline {
                if mosquitto_loop_write(connection.handle, 1) != MOSQ_ERR_SUCCESS.rawValue { break }
                var fd = pollfd(fd: mosquitto_socket(connection.handle), events: Int16(POLLOUT), revents: 0)
                _ = poll(&fd, 1, 50)
            }
        }
        connection.destroy()
        let waiters = shared.withLock { state in
            state.exited = true
            state.connected = false
            return Self.take(&state.exitWaiters)
        }
        waiters.forEach { $0() }
    }

    /// A connection that lasted this long resets the reconnect backoff.
    static let stableConnection = Duration.seconds(30)

    /// Errors that the same message would meet again on any connection.
    private static let permanent: Set<Int32> = [
        MOSQ_ERR_INVAL, MOSQ_ERR_PAYLOAD_SIZE, MOSQ_ERR_MALFORMED_UTF8, MOSQ_ERR_QOS_NOT_SUPPORTED, MOSQ_ERR_OVERSIZE_PACKET,
    ].reduce(into: []) { $0.insert($1.rawValue) }

    private func send(_ messages: [MQTTMessage], on connection: Connection) -> Int32 {
        for (index, message) in messages.enumerated() {
            let rc = message.payload.withUnsafeBytes { bytes in
                mosquitto_publish(connection.handle, nil, message.topic, Int32(bytes.count), bytes.baseAddress, message.qos, message.retain)
            }
            if Self.permanent.contains(rc) {
                shared.withLock { $0.dropped += 1 }
                onEvent(.publishRefused(topic: message.topic, reason: String(cString: mosquitto_strerror(rc))))
                continue
            }
            if rc != MOSQ_ERR_SUCCESS.rawValue {
                // Kept for the next connection, in order.
                let rest = Array(messages[index...])
                shared.withLock { $0.outbox.insert(contentsOf: rest, at: 0) }
                return rc
            }
        }
        shared.withLock { $0.published += messages.count }
        return MOSQ_ERR_SUCCESS.rawValue
    }

    /// Sleeps for the backoff; a `shutdown` ends it early. (A `publish` wakes it too, so it is
    /// drained each time: left signalled, it would turn every later wait into a busy loop.)
    private func waitForWake(timeoutS: Double) {
        let deadline = ContinuousClock.now + .milliseconds(Int(timeoutS * 1000))
        while !isStopping, ContinuousClock.now < deadline {
            var fd = pollfd(fd: wakeFD, events: Int16(POLLIN), revents: 0)
            let left = ContinuousClock.now.duration(to: deadline)
            _ = poll(&fd, 1, Int32(max(1, left.components.seconds * 1000 + left.components.attoseconds / 1_000_000_000_000_000)))
            _ = drivebus_eventfd_drain(wakeFD)
        }
    }

    private static func isReadable(_ socket: Int32) -> Bool {
        guard socket >= 0 else { return false }
        var fd = pollfd(fd: socket, events: Int16(POLLIN), revents: 0)
        return poll(&fd, 1, 0) > 0
    }

    private static func take<T>(_ items: inout [T]) -> [T] {
        defer { items = [] }
        return items
    }
}

/// The libmosquitto handle and what its callbacks report. Set up by `MQTTClient.init`, then handed
/// to the client's thread, which alone uses it.
private final class Connection: @unchecked Sendable {
    let handle: OpaquePointer
    private let configuration: MQTTClient.Configuration
    var received: [MQTTMessage] = []
    private var events: [MQTTClient.Event] = []
    private(set) var hasSocket = false
    private(set) var isConnected = false
    /// Why the broker refused the last connection, if it did.
    private(set) var failure: String?
    private var everOpened = false

    init(_ configuration: MQTTClient.Configuration) throws(MQTTError) {
        self.configuration = configuration
        guard let handle = mosquitto_new(configuration.clientID, !configuration.persistentSession, nil) else {
            throw MQTTError("mosquitto_new: \(String(cString: strerror(errno)))")
        }
        self.handle = handle
        do {
            try setUp()
        } catch {
            mosquitto_destroy(handle)
            throw error
        }
    }

    private func setUp() throws(MQTTError) {
        func check(_ rc: Int32, _ what: String) throws(MQTTError) {
            guard rc == MOSQ_ERR_SUCCESS.rawValue else { throw .library(rc, what) }
        }
        mosquitto_user_data_set(handle, Unmanaged.passUnretained(self).toOpaque())
        try check(mosquitto_int_option(handle, MOSQ_OPT_PROTOCOL_VERSION, MQTT_PROTOCOL_V5), "protocol version")
        // Small messages go out at once: with Nagle, a state update waited ~40 ms for an ACK.
        try check(mosquitto_int_option(handle, MOSQ_OPT_TCP_NODELAY, 1), "TCP_NODELAY")
        // Nothing but our own loop writes to the socket: PUBACKs wait until `receive` returned.
        try check(mosquitto_threaded_set(handle, true), "threaded mode")
        if let username = configuration.username {
            try check(mosquitto_username_pw_set(handle, username, configuration.password), "username")
        }
        if let tls = configuration.tls {
            let caPath = tls.caFile == nil ? "/etc/ssl/certs" : nil
            try check(mosquitto_tls_set(handle, tls.caFile, caPath, tls.certFile, tls.keyFile, nil), "TLS")
        }
        if let will = configuration.will {
            let rc = will.payload.withUnsafeBytes { mosquitto_will_set(handle, will.topic, Int32($0.count), $0.baseAddress, will.qos, will.retain) }
            try check(rc, "will")
        }
        mosquitto_connect_with_flags_callback_set(handle) { _, context, rc, flags in
            Connection.from(context).didConnect(rc: rc, sessionPresent: flags & 1 != 0)
        }
        mosquitto_subscribe_callback_set(handle) { _, context, mid, count, granted in
            guard let granted else { return }
            Connection.from(context).didSubscribe(mid: mid, granted: Array(UnsafeBufferPointer(start: granted, count: Int(count))))
        }
        mosquitto_disconnect_callback_set(handle) { _, context, _ in
            Connection.from(context).isConnected = false
        }
        mosquitto_message_callback_set(handle) { _, context, message in
            guard let message = message?.pointee else { return }
            let payload = message.payloadlen > 0 && message.payload != nil
                ? Array(UnsafeRawBufferPointer(start: message.payload, count: Int(message.payloadlen))) : []
            Connection.from(context).received.append(
                MQTTMessage(topic: String(cString: message.topic), payload: payload, qos: message.qos, retain: message.retain))
        }
    }

    private static func from(_ context: UnsafeMutableRawPointer?) -> Connection {
        Unmanaged<Connection>.fromOpaque(context!).takeUnretainedValue()
    }

    private func didConnect(rc: Int32, sessionPresent: Bool) {
        guard rc == 0 else {
            failure = "the broker refused the connection: \(String(cString: mosquitto_reason_string(rc)))"
            return
        }
        failure = nil
        isConnected = true
        pendingSubscriptions = [:]
        for subscription in configuration.subscriptions {
            // Retained messages only for a subscription the session did not have yet: not again
            // at every reconnect of a persistent session.
            var mid: Int32 = 0
            let rc = mosquitto_subscribe_v5(handle, &mid, subscription.filter, subscription.qos, Int32(MQTT_SUB_OPT_SEND_RETAIN_NEW.rawValue), nil)
            if rc == MOSQ_ERR_SUCCESS.rawValue {
                pendingSubscriptions[mid] = subscription
            } else {
                events.append(.subscriptionRefused(filter: subscription.filter, granted: 0x80))
            }
        }
        events.append(.connected(sessionPresent: sessionPresent))
    }

    private var pendingSubscriptions: [Int32: MQTTClient.Configuration.Subscription] = [:]

    private func didSubscribe(mid: Int32, granted: [Int32]) {
        guard let subscription = pendingSubscriptions.removeValue(forKey: mid) else { return }
        let code = granted.first ?? 0x80
        if code >= 0x80 || code < subscription.qos { events.append(.subscriptionRefused(filter: subscription.filter, granted: code)) }
    }

    func takeEvents() -> [MQTTClient.Event] {
        defer { events = [] }
        return events
    }

    /// Connects (blocking, on the client's thread); nil on success, or why not.
    func open() -> String? {
        let rc: Int32
        if everOpened {
            rc = mosquitto_reconnect(handle)
        } else {
            // v5: a session that outlives the connection, and how many messages may be in flight.
            var properties: OpaquePointer?
            if configuration.persistentSession { mosquitto_property_add_int32(&properties, Int32(MQTT_PROP_SESSION_EXPIRY_INTERVAL.rawValue), UInt32.max) }
            mosquitto_property_add_int16(&properties, Int32(MQTT_PROP_RECEIVE_MAXIMUM.rawValue), UInt16(clamping: configuration.receiveMaximum))
            mosquitto_property_add_int32(&properties, Int32(MQTT_PROP_MAXIMUM_PACKET_SIZE.rawValue), UInt32(clamping: configuration.maxPacketBytes))
            rc = mosquitto_connect_bind_v5(handle, configuration.host, Int32(configuration.port), Int32(configuration.keepAliveS), nil, properties)
            mosquitto_property_free_all(&properties)
        }
        guard rc == MOSQ_ERR_SUCCESS.rawValue else {
            return rc == MOSQ_ERR_ERRNO.rawValue ? String(cString: strerror(errno)) : String(cString: mosquitto_strerror(rc))
        }
        everOpened = true
        hasSocket = true
        return nil
    }

    func lost() {
        hasSocket = false
        isConnected = false
        received = []
    }

    func destroy() {
        mosquitto_destroy(handle)
    }
}

extension MQTTClient.Configuration: CustomStringConvertible {
    /// For logs: never the password.
    public var description: String {
        "mqtt://\(username.map { $0 + "@" } ?? "")\(host.contains(":") ? "[\(host)]" : host):\(port) client \(clientID)\(tls == nil ? "" : " tls")"
    }
}
