import ArgumentParser
import CZMQ
import DrivebusKit
import DrivebusTestSupport
import Foundation
import Synchronization

/// `drivebus-bench bus`: one PUB bound to an ipc socket, one SUB connected to it, ~200-byte
/// messages, measured three ways in the same run so the ratios compare like with like:
/// - `raw`: libzmq's C API directly (zmq_send, zmq_msg_recv);
/// - `raw_envelope_frames`: the same with three frames of a `Fix` envelope's sizes;
/// - `wrapper`: the same through `ZMQSocket`;
/// - `envelope`: full `Fix` envelopes the way services move them: `Publisher` encodes and sends
///   on its PUB itself, the subscriber's I/O thread hands frames over an `AsyncStream`, and the
///   consumer decodes header and `Fix`;
/// - `journal_pages`: the same fixes the way journal followers now take them, in `journal.page`
///   messages of up to 32 KB, as ingest publishes a commit of Overland batches of 100; the
///   consumer reads each page and decodes every `Fix`. Counted in fixes, against raw's messages.
struct BusBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "bus", abstract: "Measure the bus: raw libzmq, the Swift wrapper, full envelopes.")

    @Option(help: "Messages per raw and wrapper case.")
    var messages = 1_000_000

    @Option(help: "Messages in the envelope case.")
    var envelopes = 200_000

    @Option(help: "Repetitions of each case; the best is reported.")
    var runs = 3

    func run() async throws {
        let directory = FileManager.default.temporaryDirectory.path + "/drivebus-bench-\(getpid())"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let payload = [UInt8](repeating: UInt8(ascii: "x"), count: 200)

        let envelopeFrames = Self.fixEnvelopeFrames()
        var raw = 0.0, rawEnvelopeFrames = 0.0, wrapper = 0.0, envelope = 0.0, paged = 0.0
        for run in 0..<runs {
            raw = max(raw, rawCase(endpoint: "ipc://\(directory)/raw\(run)", frames: [payload]))
            rawEnvelopeFrames = max(rawEnvelopeFrames, rawCase(endpoint: "ipc://\(directory)/raw3-\(run)", frames: envelopeFrames))
            wrapper = max(wrapper, try wrapperCase(endpoint: "ipc://\(directory)/wrapper\(run)", payload: payload))
            envelope = max(envelope, try await envelopeCase(endpoint: "ipc://\(directory)/envelope\(run)"))
            paged = max(paged, try await journalPagesCase(endpoint: "ipc://\(directory)/pages\(run)"))
        }
        report(["name": "raw", "msgs_per_s": Int(raw), "bytes": payload.count, "messages": messages])
        report(["name": "raw_envelope_frames", "msgs_per_s": Int(rawEnvelopeFrames), "frame_bytes": envelopeFrames.map(\.count), "messages": messages,
                "ratio_to_raw": (rawEnvelopeFrames / raw * 100).rounded() / 100])
        report(["name": "wrapper", "msgs_per_s": Int(wrapper), "bytes": payload.count, "messages": messages, "ratio_to_raw": (wrapper / raw * 100).rounded() / 100])
        report(["name": "envelope", "msgs_per_s": Int(envelope), "messages": envelopes, "ratio_to_raw": (envelope / raw * 100).rounded() / 100,
                "ratio_to_raw_envelope_frames": (envelope / rawEnvelopeFrames * 100).rounded() / 100])
        report(["name": "journal_pages", "fixes_per_s": Int(paged), "fixes": envelopes, "ratio_to_raw": (paged / raw * 100).rounded() / 100])
    }

    // MARK: raw libzmq

    /// The three frames of a `Fix` envelope as a publisher sends them, for their sizes.
    private static func fixEnvelopeFrames() -> [[UInt8]] {
        let fix = Fix(
            seq: 100_000, device: "car", time: Date(timeIntervalSince1970: 1_763_800_000), lat: 48.208_2, lon: 16.373_8,
            accuracyM: 5, altitudeM: 180.5, speedMps: 13.4, courseDeg: 271, battery: 0.82, source: .overland)
        let header = EnvelopeHeader(
            id: EventID.make(run: 0x1234_5678_9abc_def0, seq: 100_000), type: "fix", source: "ingest", seq: 100_000,
            epoch: UUID().uuidString.lowercased(), time: fix.time)
        return BusMessage(topic: Topic.make("fix", device: fix.device), header: header, payload: BusJSON.encode(fix)).frames
    }

    /// `frames` make one message: one frame for `raw`; for `raw_envelope_frames`, three of the
    /// sizes of a `Fix` envelope's, which is what the bus's format (`[topic, header, payload]`)
    /// costs libzmq before any encoding.
    private func rawCase(endpoint: String, frames: [[UInt8]]) -> Double {
        let context = zmq_ctx_new()!
        defer { zmq_ctx_term(context) }
        // Handed between threads only across the joins in `measure`, which are full barriers.
        nonisolated(unsafe) let pub = zmq_socket(context, ZMQ_PUB)!
        nonisolated(unsafe) let sub = zmq_socket(context, ZMQ_SUB)!
        var zero: Int32 = 0
        for socket in [pub, sub] {
            zmq_setsockopt(socket, ZMQ_LINGER, &zero, 4)
            zmq_setsockopt(socket, ZMQ_SNDHWM, &zero, 4)
            zmq_setsockopt(socket, ZMQ_RCVHWM, &zero, 4)
        }
        zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0)
        zmq_bind(pub, endpoint)
        zmq_connect(sub, endpoint)
        let count = messages
        let messageBytes = frames.reduce(0) { $0 + $1.count }
        @Sendable func sendMessage(flags: Int32) {
            for (index, frame) in frames.enumerated() {
                let more = index < frames.count - 1 ? ZMQ_SNDMORE : 0
                frame.withUnsafeBytes { _ = zmq_send(pub, $0.baseAddress, $0.count, flags | more) }
            }
        }
        return measure(
            join: { sendMessage(flags: ZMQ_DONTWAIT) },
            joined: {
                var message = zmq_msg_t()
                zmq_msg_init(&message)
                defer { zmq_msg_close(&message) }
                guard zmq_msg_recv(&message, sub, ZMQ_DONTWAIT) >= 0 else { return false }
                while zmq_msg_more(&message) != 0 { zmq_msg_recv(&message, sub, 0) }
                return true
            },
            send: {
                for _ in 0..<count { sendMessage(flags: 0) }
            },
            receive: {
                var message = zmq_msg_t()
                zmq_msg_init(&message)
                defer { zmq_msg_close(&message) }
                var bytes = 0
                for _ in 0..<count {
                    repeat {
                        zmq_msg_recv(&message, sub, 0)
                        bytes &+= zmq_msg_size(&message)
                    } while zmq_msg_more(&message) != 0
                }
                precondition(bytes == count * messageBytes)
            },
            cleanup: {
                zmq_close(pub)
                zmq_close(sub)
            }
        )
    }

    // MARK: the wrapper

    private func wrapperCase(endpoint: String, payload: [UInt8]) throws -> Double {
        let context = ZMQContext()
        let pub = try ZMQSocket(context, .pub)
        let sub = try ZMQSocket(context, .sub)
        try pub.setHighWaterMarks(send: 0, receive: 0)
        try sub.setHighWaterMarks(send: 0, receive: 0)
        try sub.subscribe("")
        try pub.bind(endpoint)
        try sub.connect(endpoint)
        let count = messages
        // The sockets move between threads only across the joins in `measure`, which are full
        // barriers, as libzmq requires.
        nonisolated(unsafe) let pubSocket = pub
        nonisolated(unsafe) let subSocket = sub
        return measure(
            join: { payload.withUnsafeBytes { _ = try? pubSocket.send(frame: $0, more: false) } },
            joined: { ((try? subSocket.receive(dontWait: true)) ?? nil) != nil },
            send: {
                payload.withUnsafeBytes { bytes in
                    for _ in 0..<count { _ = try? pubSocket.send(frame: bytes, more: false, dontWait: false) }
                }
            },
            receive: {
                var bytes = 0
                for _ in 0..<count {
                    _ = try? subSocket.receive(dontWait: false) { (_, frame: UnsafeRawBufferPointer) in bytes &+= frame.count }
                }
                precondition(bytes == count * payload.count)
            },
            cleanup: {
                pubSocket.close()
                subSocket.close()
            }
        )
    }

    /// Runs sender and receiver on two threads of their own once the subscription is live, and
    /// returns messages per second from the first send to the last receive.
    private func measure(
        join: @escaping () -> Void, joined: @escaping () -> Bool,
        send: @escaping @Sendable () -> Void, receive: @escaping @Sendable () -> Void, cleanup: () -> Void
    ) -> Double {
        // A SUB receives only once its subscription has reached the PUB.
        while true {
            join()
            usleep(1000)
            if joined() { break }
        }
        while joined() {}
        let done = DispatchSemaphore(value: 0)
        let started = ContinuousClock.now
        Thread { receive(); done.signal() }.start()
        Thread { send() }.start()
        done.wait()
        let elapsed = seconds(started.duration(to: .now))
        cleanup()
        return Double(messages) / elapsed
    }

    // MARK: full envelopes

    private func envelopeCase(endpoint: String) async throws -> Double {
        try await fixesCase(endpoint: endpoint, prefixes: ["fix."]) { publisher, fixes in
            for fix in fixes { try publisher.publish("fix", device: "car", payload: fix) }
        } receive: { message in
            [try message.decode(Fix.self)]
        }
    }

    /// The fixes as ingest publishes a commit of one Overland batch of 100 for its followers:
    /// its records, in pages of up to 32 KB.
    private func journalPagesCase(endpoint: String) async throws -> Double {
        try await fixesCase(endpoint: endpoint, prefixes: [JournalPage.type]) { publisher, fixes in
            var page = JournalPage.Builder()
            func send() throws {
                guard let (firstSeq, payload) = page.take() else { return }
                try publisher.publish(JournalPage.type, payloadJSON: payload, logSeq: firstSeq)
            }
            for (index, fix) in fixes.enumerated() {
                let payload = BusJSON.encode(fix)
                if page.isFull(adding: 8 + payload.count) { try send() }
                page.append(seq: UInt64(index + 1), topic: "fix.car", payload: payload)
                if (index + 1) % 100 == 0 { try send() }
            }
            try send()
        } receive: { message in
            guard message.topic == JournalPage.type else { return [] }
            return try JournalPage.decode(message.payload).map { try BusJSON.decode(Fix.self, from: $0.payload) }
        }
    }

    /// Fixes/s from a `Publisher` on a PUB to a subscriber of `prefixes` through `AsyncStream`, as
    /// services move them: `send` publishes the fixes (each made as it is taken, so that making
    /// and encoding it count), `receive` decodes what a message carries. Checked whole and in
    /// order.
    private func fixesCase(
        endpoint: String, prefixes: [String],
        send: @escaping @Sendable (Publisher, _ fixes: LazyMapSequence<Range<Int>, Fix>) throws -> Void,
        receive: (BusMessage) throws -> [Fix]
    ) async throws -> Double {
        let publisherLoop = ZMQLoop(name: "bench-pub")
        let subscriberLoop = ZMQLoop(name: "bench-sub")
        let socket = try await publisherLoop.openPublishingSocket(bind: ZMQEndpoint(endpoint), highWaterMark: 0)
        let publisher = Publisher(source: "ingest", socket: socket)
        var messages = try await subscriberLoop.subscribeToBus(
            ZMQEndpoint(endpoint), prefixes: prefixes + ["fix.marker", "probe"], highWaterMark: 0, bufferLimit: Int.max
        ).makeAsyncIterator()
        await awaitProbe(from: publisher, on: &messages)
        publisher.publishMarker()
        while let message = await messages.next(), message.topic != "fix.marker" {}

        let count = envelopes
        let start = Date(timeIntervalSince1970: 1_763_700_000)
        let started = ContinuousClock.now
        let sending = Task.detached {
            try send(publisher, (0..<count).lazy.map { index in
                Fix(
                    seq: UInt64(index + 1), device: "car", time: start.addingTimeInterval(Double(index)),
                    lat: 48.208_2 + Double(index) * 1e-6, lon: 16.373_8, accuracyM: 5, altitudeM: 180.5,
                    speedMps: 13.4, courseDeg: 271, battery: 0.82, source: .overland)
            })
        }
        var received = 0
        var checksum: UInt64 = 0
        while received < count, let message = await messages.next() {
            for fix in try receive(message) {
                checksum &+= fix.seq ?? 0
                received += 1
            }
        }
        let elapsed = seconds(started.duration(to: .now))
        try await sending.value
        precondition(checksum == UInt64(count) * UInt64(count + 1) / 2, "fixes were lost or reordered")
        await subscriberLoop.shutdown()
        await publisherLoop.shutdown()
        return Double(count) / elapsed
    }
}

extension Publisher {
    fileprivate func publishMarker() {
        _ = try? publish("fix", device: "marker", payload: RPCEmpty())
    }
}
