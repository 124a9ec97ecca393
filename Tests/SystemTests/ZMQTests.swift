import DrivebusJournal
import DrivebusConfiguration
import DrivebusKit
import DrivebusTestSupport
import Foundation
import Logging
import Testing

/// Messages one by one from a subscription's batches.
struct Messages {
    var batches: AsyncStream<[ZMQMessage]>.AsyncIterator
    var pending: [ZMQMessage] = []

    init(_ stream: AsyncStream<[ZMQMessage]>) { batches = stream.makeAsyncIterator() }

    mutating func next() async -> ZMQMessage? {
        while pending.isEmpty {
            guard let batch = await batches.next() else { return nil }
            pending = batch.reversed()
        }
        return pending.removeLast()
    }
}

@Suite struct ZMQTests {
    /// Publishes `probe` until the subscriber has it: a SUB only receives once its subscription
    /// has reached the PUB ("slow joiner").
    func waitUntilJoined(_ loop: ZMQLoop, _ pub: ZMQLoop.SocketID, _ iterator: inout Messages, topic: String) async {
        let probe = Task {
            while !Task.isCancelled {
                loop.send([Array(topic.utf8), Array("probe".utf8)], on: pub)
                try? await Task.sleep(for: .milliseconds(10))
            }
        }
        _ = await iterator.next()
        probe.cancel()
        _ = await probe.value
    }

    @Test func pubSubOverIPCDeliversInOrderAndFiltersByPrefix() async throws {
        let dir = TempDir()
        let endpoint = ZMQEndpoint("ipc://\(dir.path)/pubsub")
        let publisherLoop = ZMQLoop(name: "pub")
        let subscriberLoop = ZMQLoop(name: "sub")
        let pub = try await publisherLoop.openSocket(.pub, bind: endpoint, highWaterMark: 0)
        var messages = Messages(try await subscriberLoop.subscribe(endpoint, prefixes: ["probe", "fix."]))
        await waitUntilJoined(publisherLoop, pub, &messages, topic: "probe")
        // Drain probes still in flight by sending a marker after them.
        publisherLoop.send([Array("fix.marker".utf8), []], on: pub)
        while let message = await messages.next(), message[0] != Array("fix.marker".utf8) {}

        for index in 0..<200 {
            publisherLoop.send([Array("trip.car".utf8), Array("no".utf8)], on: pub)
            publisherLoop.send([Array("fix.car".utf8), Array(String(index).utf8), Array(repeating: UInt8(index % 256), count: index)], on: pub)
        }
        for index in 0..<200 {
            let message = try #require(await messages.next())
            #expect(message.count == 3)
            #expect(String(decoding: message[0], as: UTF8.self) == "fix.car")
            #expect(String(decoding: message[1], as: UTF8.self) == String(index))
            #expect(message[2] == Array(repeating: UInt8(index % 256), count: index))
        }
        #expect(publisherLoop.droppedSendCount == 0)
        await subscriberLoop.shutdown()
        await publisherLoop.shutdown()
    }

    @Test func messagesOfAnySizeArriveWhole() async throws {
        let dir = TempDir()
        let endpoint = ZMQEndpoint("ipc://\(dir.path)/big")
        let loop = ZMQLoop(name: "big")
        let pub = try await loop.openSocket(.pub, bind: endpoint, highWaterMark: 0)
        var messages = Messages(try await loop.subscribe(endpoint, prefixes: ["big", "probe"]))
        await waitUntilJoined(loop, pub, &messages, topic: "probe")
        let payload = (0..<(4 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        loop.send([Array("big".utf8), payload], on: pub)
        var received: ZMQMessage?
        while let message = await messages.next() {
            if message[0] == Array("big".utf8) { received = message; break }
        }
        #expect(received?[1] == payload)
        await loop.shutdown()
    }

    /// A bus subscription makes envelopes on the I/O thread from frames in place: what is not a
    /// valid envelope is dropped there without disturbing the next message, and each message keeps
    /// its own publisher's epoch (one is reused from the last header only when it is the same).
    @Test(.timeLimit(.minutes(1))) func aBusSubscriptionDropsWhatIsNotAnEnvelopeAndKeepsEachEpoch() async throws {
        let dir = TempDir()
        let endpoint = ZMQEndpoint("ipc://\(dir.path)/envelopes")
        let publisherLoop = ZMQLoop(name: "pub")
        let subscriberLoop = ZMQLoop(name: "sub")
        let pub = try await publisherLoop.openSocket(.pub, bind: endpoint, highWaterMark: 0)
        var messages = try await subscriberLoop.subscribeToBus(endpoint, prefixes: ["fix.", "probe"], highWaterMark: 0).makeAsyncIterator()
        func header(_ epoch: String, _ seq: Int, v: Int = 1) -> [UInt8] {
            Array(#"{"v":\#(v),"id":"id-\#(seq)","type":"fix","source":"ingest","seq":\#(seq),"epoch":"\#(epoch)","time":"2025-11-21T04:40:00.000Z"}"#.utf8)
        }
        let probing = Task {
            while !Task.isCancelled {
                publisherLoop.send([Array("probe".utf8), header("p", 0), Array("{}".utf8)], on: pub)
                try? await Task.sleep(for: .milliseconds(10))
            }
        }
        _ = await messages.next()
        probing.cancel()
        _ = await probing.value
        publisherLoop.send([Array("fix.marker".utf8), header("p", 0), []], on: pub)
        while let message = await messages.next(), message.topic != "fix.marker" {}

        let first = "0b1c6f1e-5f0e-4a8e-9a3b-6f1d2c3b4a59", second = "9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"
        let sent: [[[UInt8]]] = [
            [Array("fix.car".utf8), header(first, 1), Array("one".utf8)],
            [Array("fix.car".utf8), header(first, 2)],  // no payload
            [Array("fix.car".utf8), header(first, 3), Array("x".utf8), Array("y".utf8)],  // a frame too many
            [Array("fix.c r".utf8), header(first, 4), Array("x".utf8)],  // not a topic
            [Array("fix.car".utf8), header(first, 5), Array("after".utf8)],
            [Array("fix.car".utf8), Array("{nope".utf8), Array("x".utf8)],
            [Array("fix.car".utf8), header(first, 6, v: 2), Array("x".utf8)],  // a newer major version
            [Array("fix.van".utf8), header(second, 1), Array("two".utf8)],
            [Array("fix.car".utf8), header(first, 7), Array("three".utf8)],
            [Array("fix.car".utf8), header(#"0b1c6f1e-5f0e-4a8e-9a3b-6f1d2c3b4a5\u0039"#, 8), Array("four".utf8)],  // `first`, escaped
            [Array("fix.car".utf8), header(first, 9), []],
        ]
        for frames in sent { publisherLoop.send(frames, on: pub) }
        var received: [BusMessage] = []
        while received.count < 6, let message = await messages.next() { received.append(message) }
        #expect(received.map(\.topic) == ["fix.car", "fix.car", "fix.van", "fix.car", "fix.car", "fix.car"])
        #expect(received.map(\.header.seq) == [1, 5, 1, 7, 8, 9])
        #expect(received.map(\.header.epoch) == [first, first, second, first, first, first])
        #expect(received.map { String(decoding: $0.payload, as: UTF8.self) } == ["one", "after", "two", "three", "four", ""])
        for (message, frames) in zip(received, [sent[0], sent[4], sent[7], sent[8], sent[9], sent[10]]) {
            let expected = try BusMessage(frames: frames)
            #expect(message.header == expected.header)
            #expect(message.payload == expected.payload)
        }
        await subscriberLoop.shutdown()
        await publisherLoop.shutdown()
    }

    /// A publisher's socket is sent on by whichever task publishes, not by its loop's thread: many
    /// tasks at once must still put out whole messages, numbered in the order they were sent; and
    /// once the loop has stopped (and closed the socket) a publish drops its message quietly.
    @Test(.timeLimit(.minutes(1))) func publishersOnManyTasksSendWholeMessagesInSeqOrder() async throws {
        let dir = TempDir()
        let endpoint = ZMQEndpoint("ipc://\(dir.path)/publisher")
        let publisherLoop = ZMQLoop(name: "pub")
        let subscriberLoop = ZMQLoop(name: "sub")
        let publisher = Publisher(source: "test", socket: try await publisherLoop.openPublishingSocket(bind: endpoint, highWaterMark: 0))
        var messages = try await subscriberLoop.subscribeToBus(endpoint, prefixes: ["fix.", "probe"], highWaterMark: 0, bufferLimit: Int.max).makeAsyncIterator()
        await awaitProbe(from: publisher, on: &messages)
        let firstSeq = publisher.lastSeq + 1

        let tasks = 4, each = 500
        let start = Date(timeIntervalSince1970: 1_763_700_000)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for task in 0..<tasks {
                group.addTask {
                    for index in 0..<each {
                        let fix = Fix(seq: UInt64(index + 1), device: "car\(task)", time: start.addingTimeInterval(Double(index)), lat: 48, lon: 16, source: .api)
                        try publisher.publish("fix", device: "car\(task)", payload: fix)
                    }
                }
            }
            try await group.waitForAll()
        }
        var nextSeq = firstSeq
        var nextFix = [UInt64](repeating: 1, count: tasks)
        while nextSeq < firstSeq + UInt64(tasks * each), let message = await messages.next() {
            guard message.header.seq >= firstSeq else { continue }  // a probe still in flight
            #expect(message.header.seq == nextSeq)
            nextSeq = message.header.seq + 1
            let fix = try message.decode(Fix.self)
            #expect(message.topic == "fix.\(fix.device)")
            let task = try #require(Int(fix.device.dropFirst(3)))
            #expect(fix.seq == nextFix[task])
            nextFix[task] += 1
        }
        #expect(nextFix == [UInt64](repeating: UInt64(each + 1), count: tasks))

        await publisherLoop.shutdown()
        let after = try publisher.publish("fix", device: "car0", payload: RPCEmpty())
        #expect(after == firstSeq + UInt64(tasks * each))
        await subscriberLoop.shutdown()
    }

    /// A server on an ipc socket that answers every request with `answer(body)`, and a client
    /// loop for `body`; both shut down after.
    func withServer(answering answer: @escaping @Sendable ([UInt8]) -> [UInt8], _ body: (ZMQLoop, ZMQEndpoint) async throws -> Void) async throws {
        let dir = TempDir()
        let endpoint = ZMQEndpoint("ipc://\(dir.path)/svc.rpc")
        let server = ZMQLoop(name: "server")
        let client = ZMQLoop(name: "client")
        let (requests, socket) = try await server.serveRequests(endpoint)
        let serving = Task {
            for await request in requests { server.reply(to: request, with: answer(request.body), on: socket) }
        }
        try await body(client, endpoint)
        await server.shutdown()
        _ = await serving.value
        await client.shutdown()
    }

    @Test func requestsAndRepliesOverIPC() async throws {
        try await withServer(answering: { Array("echo:".utf8) + $0 }) { client, endpoint in
            // Concurrent calls each get their own answer.
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0..<25 {
                    group.addTask {
                        let reply = try await client.request(endpoint, body: Array("n\(index)".utf8), timeout: .seconds(5))
                        #expect(String(decoding: reply, as: UTF8.self) == "echo:n\(index)")
                    }
                }
                try await group.waitForAll()
            }
        }
    }

    /// A reply belongs to the caller alone once `request` returns: the request's timeout timer,
    /// which outlives it, held every reply (a consumer's replay pages: tens of megabytes under
    /// a flood) until the timeout ran out. A buffer shared with anything else is copied on the
    /// caller's first write, so its address tells.
    @Test func aReturnedReplyIsHeldByNothingElse() async throws {
        try await withServer(answering: { _ in [UInt8](repeating: 7, count: 1 << 20) }) { client, endpoint in
            var reply = try await client.request(endpoint, body: [1], timeout: .seconds(60))
            // The loop's thread may still be inside the callback that delivered the first reply;
            // it has left it once a second request, which it runs after, has returned.
            _ = try await client.request(endpoint, body: [2], timeout: .seconds(60))
            let before = reply.withUnsafeBufferPointer { UInt(bitPattern: $0.baseAddress) }
            reply[0] = 8
            #expect(reply.withUnsafeBufferPointer { UInt(bitPattern: $0.baseAddress) } == before)
            #expect(reply.count == 1 << 20)
        }
    }

    /// Pipelined requests go over one connection: the server sees them in the order sent, and
    /// each caller gets its own answer though the server answers last to first.
    @Test func pipelinedRequestsArriveInOrderAndAnswersFindTheirCallers() async throws {
        let dir = TempDir()
        let endpoint = ZMQEndpoint("ipc://\(dir.path)/svc.rpc")
        let server = ZMQLoop(name: "server")
        let client = ZMQLoop(name: "client")
        let (requests, socket) = try await server.serveRequests(endpoint)
        let count = 40
        let serving = Task {
            var arrived: [ZMQRequest] = []
            for await request in requests {
                arrived.append(request)
                guard arrived.count == count else { continue }
                for request in arrived.reversed() { server.reply(to: request, with: Array("echo:".utf8) + request.body, on: socket) }
                return arrived.map { String(decoding: $0.body, as: UTF8.self) }
            }
            return []
        }
        let channel = PipelinedRequester(loop: client, endpoint: endpoint)
        let answers = (0..<count).map { channel.send(Array("n\($0)".utf8), timeout: .seconds(10)) }
        for (index, answer) in answers.enumerated() { #expect(String(decoding: try await answer.value, as: UTF8.self) == "echo:n\(index)") }
        #expect(await serving.value == (0..<count).map { "n\($0)" })
        channel.close()
        await server.shutdown()
        await client.shutdown()
    }

    @Test func requestToNobodyTimesOutWithATypedError() async throws {
        let dir = TempDir()
        let loop = ZMQLoop(name: "client")
        let started = ContinuousClock.now
        do {
            _ = try await loop.request(ZMQEndpoint("ipc://\(dir.path)/nobody.rpc"), body: [1], timeout: .milliseconds(200))
            Issue.record("a request to nobody returned")
        } catch let error as ZMQError {
            #expect(error.errno == ETIMEDOUT)
            #expect(error.endpoint == "ipc://\(dir.path)/nobody.rpc")
        }
        // It gives up instead of waiting forever. Generous: the suite runs tests in parallel on
        // two cores, and a saturated machine once took 13.8 s to get here.
        #expect(started.duration(to: .now) < .seconds(60))
        await loop.shutdown()
    }

    @Test func timersFireInDeadlineOrderWhateverOrderTheyWereScheduledIn() async throws {
        let loop = ZMQLoop(name: "timers")
        let delays = [40, 5, 25, 15, 60, 10, 30, 20, 50, 35, 45, 55]
        let (fired, firing) = AsyncStream.makeStream(of: Int.self)
        // Each deadline is counted from when its timer is scheduled, and on a busy machine the
        // loop below can be preempted between two: each deadline is known to lie between the
        // clock read just before its `schedule` and just after.
        let deadlines = try await loop.perform { io -> [(earliest: ContinuousClock.Instant, latest: ContinuousClock.Instant)] in
            var deadlines: [(earliest: ContinuousClock.Instant, latest: ContinuousClock.Instant)] = []
            for (index, delay) in delays.enumerated() {
                let before = ContinuousClock.now
                io.schedule(after: .milliseconds(delay)) { firing.yield(index) }
                deadlines.append((before + .milliseconds(delay), .now + .milliseconds(delay)))
            }
            // Held past every deadline, so that all are due in the loop's next round together.
            usleep(100_000)
            return deadlines
        }
        // A timer that never fires fails the test instead of hanging it.
        let deadline = Task {
            try? await Task.sleep(for: .seconds(20))
            firing.finish()
        }
        var order: [Int] = []
        for await index in fired {
            order.append(index)
            if order.count == delays.count { break }
        }
        deadline.cancel()
        #expect(Set(order) == Set(delays.indices))
        // In deadline order: no timer fired after one whose deadline was surely later.
        for (first, second) in zip(order, order.dropFirst()) {
            #expect(deadlines[first].earliest <= deadlines[second].latest, "\(order)")
        }
        await loop.shutdown()
    }

    @Test func errorsCarryErrnoOperationAndEndpoint() throws {
        let context = ZMQContext()
        let socket = try ZMQSocket(context, .pub)
        do {
            try socket.bind("ipc:///nonexistent-dir/x/bus.in")
            Issue.record("bind into a missing directory succeeded")
        } catch {
            #expect(error.operation == "zmq_bind")
            #expect(error.endpoint == "ipc:///nonexistent-dir/x/bus.in")
            #expect(error.errno == ENOENT)
            #expect(error.code == "zmq.ENOENT")
        }
        let first = try ZMQSocket(context, .rep)
        try first.bind("tcp://127.0.0.1:0")
        let bound = try first.lastEndpoint()
        #expect(bound.hasPrefix("tcp://127.0.0.1:"))
        let second = try ZMQSocket(context, .rep)
        #expect(throws: ZMQError(errno: EADDRINUSE, operation: "zmq_bind", endpoint: bound)) { try second.bind(bound) }
        socket.close()
        first.close()
        second.close()
    }

    @Test func wouldBlockIsAValueNotAnError() throws {
        let dir = TempDir()
        let context = ZMQContext()
        let pull = try ZMQSocket(context, .pull)
        try pull.bind("ipc://\(dir.path)/pull")
        #expect(try pull.receive(dontWait: true) == nil)
        // PUSH with no peer would block: send reports false instead of throwing.
        let push = try ZMQSocket(context, .push)
        try push.setOption(ZMQOption.immediate, 1)
        try push.connect("ipc://\(dir.path)/nobody")
        #expect(try push.send([[1, 2, 3]]) == false)
        pull.close()
        push.close()
    }

    @Test func curveOverTCPAuthenticatesTheServer() async throws {
        try #require(ZMQContext.hasCurve)
        let server = try CurveKeyPair.generate()
        let client = try CurveKeyPair.generate()
        #expect(server.publicKey.utf8.count == 40)
        let port = freePort()
        let loop = ZMQLoop(name: "curve")
        let (requests, socket) = try await loop.serveRequests(ZMQEndpoint("tcp://127.0.0.1:\(port)", curve: .server(server)))
        let serving = Task {
            for await request in requests { loop.reply(to: request, with: request.body, on: socket) }
        }
        let good = ZMQEndpoint("tcp://127.0.0.1:\(port)", curve: .client(serverPublicKey: server.publicKey, own: client))
        #expect(try await loop.request(good, body: Array("secret".utf8), timeout: .seconds(5)) == Array("secret".utf8))
        // A client that expects another server key never completes the handshake.
        let impostor = try CurveKeyPair.generate()
        let wrong = ZMQEndpoint("tcp://127.0.0.1:\(port)", curve: .client(serverPublicKey: impostor.publicKey, own: client))
        await #expect(throws: ZMQError.self) { try await loop.request(wrong, body: [1], timeout: .milliseconds(300)) }
        // Nor does a plain-text client.
        await #expect(throws: ZMQError.self) { try await loop.request(ZMQEndpoint("tcp://127.0.0.1:\(port)"), body: [1], timeout: .milliseconds(300)) }
        await loop.shutdown()
        _ = await serving.value
    }

    @Test func theLoopThreadCarriesItsNameForTheOS() async throws {
        // What top -H, ps -L and perf show; longer names are cut to Linux's 15 bytes.
        for (name, expected) in [("ingest", "zmq-ingest"), ("a-very-long-name", "zmq-a-very-long")] {
            let loop = ZMQLoop(name: name)
            let comm = try await loop.perform { _ in try String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8) }
            #expect(comm.trimmingCharacters(in: .newlines) == expected)
            await loop.shutdown()
        }
    }

    @Test func shutdownFinishesStreamsAndRefusesLaterWork() async throws {
        let dir = TempDir()
        let loop = ZMQLoop(name: "stop")
        let stream = try await loop.subscribe(ZMQEndpoint("ipc://\(dir.path)/x"), prefixes: [""])
        await loop.shutdown()
        var count = 0
        for await _ in stream { count += 1 }
        #expect(count == 0)
        await #expect(throws: ZMQLoop.LoopError.self) { try await loop.perform { _ in 1 } }
        await loop.shutdown()
    }
}

/// What ingest's journal puts on the bus for each commit: every record alone (external tools'
/// topics) and the same records in pages of at most 32 KB, which journal followers read.
@Suite struct JournalBroadcastTests {
    @Test(.timeLimit(.minutes(1))) func aCommitGoesOutRecordByRecordAndInPagesWithTheJournalsBytes() async throws {
        let dir = TempDir()
        let endpoint = ZMQEndpoint("ipc://\(dir.path)/bus")
        let publisherLoop = ZMQLoop(name: "pub")
        let subscriberLoop = ZMQLoop(name: "sub")
        let publisher = Publisher(source: "ingest", socket: try await publisherLoop.openPublishingSocket(bind: endpoint, highWaterMark: 0))
        var messages = try await subscriberLoop.subscribeToBus(endpoint, prefixes: ["fix.", JournalPage.type, "probe"], highWaterMark: 0, bufferLimit: Int.max).makeAsyncIterator()
        await awaitProbe(from: publisher, on: &messages)
        let journal = try Journal(path: dir.path + "/journal") { committed in
            JournalBroadcast.publish(committed, on: publisher, logger: Logger(label: "test"))
        }
        // One commit of 300 fixes (about 60 KB of payloads), then one of a single fix.
        let start = Date(timeIntervalSince1970: 1_763_700_000)
        let fixes = (0..<301).map { index in
            JournalRecord(.fix(Fix(device: "car", time: start.addingTimeInterval(Double(index)), lat: 48 + Double(index) * 1e-5, lon: 16, source: .api)))
        }
        _ = try await journal.append(Array(fixes[..<300]))
        _ = try await journal.append([fixes[300]])
        let journaled = try journal.replay(fromSeq: 1, limit: 1000)
        #expect(journaled.count == 301)

        var alone: [JournalMessage] = [], paged: [JournalMessage] = [], pageSizes: [Int] = []
        while alone.count < 301 || paged.count < 301, let message = await messages.next() {
            if message.topic == JournalPage.type {
                let records = try JournalPage.decode(message.payload)
                #expect(message.header.logSeq == records.first?.seq)
                #expect(message.payload.count <= JournalPage.maxBytes)
                paged += records
                pageSizes.append(records.count)
            } else if message.topic.hasPrefix("fix.") {
                alone.append(JournalMessage(seq: try #require(message.header.logSeq), topic: message.topic, payload: message.payload))
            }
        }
        for received in [alone, paged] {
            #expect(received.map(\.seq) == journaled.map(\.seq))
            #expect(received.map(\.topic) == journaled.map(\.topic))
            #expect(received.map(\.payload) == journaled.map(\.payload))
        }
        // The first commit needs several pages, each as full as the limit lets it be; the
        // second commit is a page of its own.
        let firstCommitBytes = journaled.prefix(300).reduce(0) { $0 + $1.payload.count + 40 }
        #expect(pageSizes.count >= 2 + firstCommitBytes / JournalPage.maxBytes)
        #expect(pageSizes.count <= 3 + firstCommitBytes / JournalPage.maxBytes)
        #expect(pageSizes.last == 1)
        await subscriberLoop.shutdown()
        await publisherLoop.shutdown()
    }
}

/// An XPUB publisher learns what is subscribed and does not make what nobody wants; a
/// subscription that arrives later, or goes, is heeded.
@Suite struct SubscriptionAwarePublisherTests {
    @Test(.timeLimit(.minutes(1))) func messagesNobodySubscribedToAreNotMadeAndNewSubscriptionsAreHeeded() async throws {
        let dir = TempDir()
        let endpoint = ZMQEndpoint("ipc://\(dir.path)/bus")
        let publisherLoop = ZMQLoop(name: "pub")
        let subscriberLoop = ZMQLoop(name: "sub")
        let socket = try await publisherLoop.openPublishingSocket(bind: endpoint, highWaterMark: 0, learnsSubscriptions: true)
        let publisher = Publisher(source: "test", socket: socket)
        func made(_ topic: String) -> Bool { socket.withSocket(sendingOn: Array(topic.utf8)) { _ in true } ?? false }

        #expect(!made("fix.car"), "nobody has subscribed yet")
        var messages = try await subscriberLoop.subscribeToBus(endpoint, prefixes: ["fix.", "probe"], highWaterMark: 0, bufferLimit: Int.max).makeAsyncIterator()
        await awaitProbe(from: publisher, on: &messages)
        #expect(made("fix.car"))
        #expect(made("fix."))
        #expect(!made("trip.ended.car"))
        #expect(!made("fix"), "a topic shorter than the prefix")
        try publisher.publish("trip.ended", device: "car", payload: RPCEmpty())
        try publisher.publish("fix", device: "car", payload: RPCEmpty())
        // Probes sent while the first one was on its way may come first.
        var received = await messages.next()
        while received?.topic == "probe" { received = await messages.next() }
        #expect(received?.topic == "fix.car")

        // A second subscriber's prefix is heeded once it arrives; when it goes, it is forgotten.
        let secondLoop = ZMQLoop(name: "second")
        var trips = try await secondLoop.subscribeToBus(endpoint, prefixes: ["trip."], highWaterMark: 0, bufferLimit: Int.max).makeAsyncIterator()
        #expect(await eventually(within: .seconds(10)) { made("trip.ended.car") })
        try publisher.publish("trip.ended", device: "car", payload: RPCEmpty())
        #expect(await trips.next()?.topic == "trip.ended.car")
        await secondLoop.shutdown()
        #expect(await eventually(within: .seconds(10)) { !made("trip.ended.car") })
        #expect(made("fix.car"))

        await subscriberLoop.shutdown()
        await publisherLoop.shutdown()
    }
}

extension SubscriptionAwarePublisherTests {
    /// Through the real broker, as services publish: subscriptions reach the publisher, go when
    /// their subscriber goes, and a broker restart leaves none behind from before it.
    @Test(.timeLimit(.minutes(2))) func subscriptionsThroughTheBrokerSurviveItsRestartWithoutStaleOnes() async throws {
        let dir = TempDir()
        let (path, config, _, _) = try testSystem(dir, "state")
        try FileManager.default.createDirectory(atPath: config.layout.runDir, withIntermediateDirectories: true)
        var broker = try Child("drivebus-bus", ["--config", path])
        defer { broker.signal(SIGKILL) }
        let publishing = BusClient(settings: config.process, name: "publishing")
        let endpoint = config.process.busEndpoints().in
        let socket = try await publishing.loop.openPublishingSocket(connect: endpoint, highWaterMark: 1000, learnsSubscriptions: true)
        let publisher = Publisher(source: "test", socket: socket)
        func made(_ topic: String) -> Bool { socket.withSocket(sendingOn: Array(topic.utf8)) { _ in true } ?? false }
        func publishUntilReceived(_ messages: inout BusSubscription.AsyncIterator) async -> Bool {
            let publishing = Task {
                while !Task.isCancelled {
                    _ = try? publisher.publish("fix", device: "car", payload: RPCEmpty())
                    try? await Task.sleep(for: .milliseconds(20))
                }
            }
            defer { publishing.cancel() }
            return await messages.next()?.topic == "fix.car"
        }

        var subscriber = BusClient(settings: config.process, name: "subscriber")
        var messages = try await subscriber.subscribe(["fix."]).makeAsyncIterator()
        #expect(await publishUntilReceived(&messages))
        #expect(made("fix.car"))
        #expect(!made("trip.ended.car"))
        // The subscriber goes: the broker tells the publisher.
        await subscriber.shutdown()
        #expect(await eventually(within: .seconds(10)) { !made("fix.car") })

        // Subscribed again, then the broker dies and the subscriber leaves while it is down.
        subscriber = BusClient(settings: config.process, name: "subscriber")
        messages = try await subscriber.subscribe(["fix."]).makeAsyncIterator()
        #expect(await publishUntilReceived(&messages))
        broker.signal(SIGKILL)
        _ = try await broker.exitStatus()
        await subscriber.shutdown()
        broker = try Child("drivebus-bus", ["--config", path])
        // The new broker has no subscriber of fix.: nothing from before the restart is kept.
        #expect(await eventually(within: .seconds(10)) { !made("fix.car") })
        let late = BusClient(settings: config.process, name: "late")
        var lateMessages = try await late.subscribe(["fix."]).makeAsyncIterator()
        #expect(await publishUntilReceived(&lateMessages))
        #expect(made("fix.car"))
        await late.shutdown()
        await publishing.shutdown()
    }
}
