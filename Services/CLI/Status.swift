import ArgumentParser
import DrivebusConfiguration
import DrivebusKit
import DrivebusRoadLimits
import DrivebusSchema
import Foundation

struct Status: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show each service's health, last seq and uptime. Exits 0 only if all are healthy.")

    @OptionGroup var options: ConfigOption

    @Option(help: "Seconds to wait for each service's answer.")
    var timeout: Double = 2

    @Flag(help: "Print one JSON object per service instead of a table.")
    var json = false

    func run() async throws {
        let config = try loadConfig(options)
        let bus = BusClient(settings: config.process, name: "status")
        let wait = Duration.milliseconds(Int(timeout * 1000))
        let services = config.services
        // Each service is asked in a task of its own; the answers come back in order. Not a task
        // group returning `(service, try await …)`: Swift 6.3.1 at -O loses the captured value
        // across the suspension in that shape (every answer came back as `bus`).
        var tasks: [Task<Result<HealthReply, any Error>, Never>] = []
        for service in services {
            tasks.append(Task {
                do {
                    return .success(try await bus.call(service, RPCRequestHead(op: "health"), as: HealthReply.self, timeout: wait))
                } catch {
                    return .failure(error)
                }
            })
        }
        var replies: [Result<HealthReply, any Error>] = []
        for task in tasks { replies.append(await task.value) }
        let deadLetters = try? await bus.call(.geofence, RPCRequestHead(op: "dead_letters"), as: DeadLetters.self, timeout: wait)
        let mqtt = config.mqtt == nil ? nil : try? await bus.call(.mqtt, RPCRequestHead(op: "mqtt_status"), as: MQTTStatus.self, timeout: wait)
        await bus.shutdown()

        var healthy = true
        let rows: [[String]] = zip(services, replies).map { service, reply in
            switch reply {
            case .success(let health):
                if health.status != "ok" { healthy = false }
                let seqs = health.lastSeq.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
                return [service.rawValue, health.status, String(health.pid), Self.uptime(health.uptimeS), String(health.publishedSeq), seqs.isEmpty ? "-" : seqs]
            case .failure(let error as ZMQError) where error.errno == ETIMEDOUT:
                healthy = false
                return [service.rawValue, "down", "-", "-", "-", "no answer within \(timeout) s at \(error.endpoint ?? "?")"]
            case .failure(let error):
                healthy = false
                return [service.rawValue, "down", "-", "-", "-", "\(error)"]
            }
        }
        if json {
            for row in rows {
                let object: [String: String] = ["service": row[0], "status": row[1], "pid": row[2], "uptime": row[3], "published_seq": row[4], "last_seq": row[5]]
                let data = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
                print(String(decoding: data, as: UTF8.self))
            }
            if let deadLetters {
                let data = try JSONSerialization.data(withJSONObject: ["dead_letters": deadLetters.calls.count], options: [.sortedKeys])
                print(String(decoding: data, as: UTF8.self))
            }
            if let mqtt {
                let data = try JSONSerialization.data(withJSONObject: ["mqtt": ["connected": mqtt.connected, "broker": mqtt.broker, "counters": mqtt.counters]], options: [.sortedKeys])
                print(String(decoding: data, as: UTF8.self))
            }
        } else {
            print(Self.table([["SERVICE", "STATUS", "PID", "UPTIME", "PUBLISHED", "LAST SEQ"]] + rows))
            if let mqtt { print("\n" + mqtt.summary) }
            if let limits = RoadLimitIndex.header(path: config.layout.roadLimitsIndex) {
                print("\nSPEED LIMITS: from \(limits.source), \(limits.ways) road pieces (\(limits.taggedWays) with a maxspeed)")
            }
            if let calls = deadLetters?.calls, !calls.isEmpty {
                // Gate calls given up on: refused, failed or too old to open a gate for.
                print("\nDEAD LETTERS (\(calls.count)): gate calls given up on")
                let recent = calls.suffix(10).map { call in
                    [call.gate, call.device, call.state, String(call.attempts), call.finishedAt.map(RFC3339.format) ?? "-", call.lastError ?? "-"]
                }
                print(Self.table([["GATE", "DEVICE", "STATE", "ATTEMPTS", "FINISHED", "LAST ERROR"]] + recent))
            }
        }
        if !healthy { throw ExitCode(1) }
    }

    static func uptime(_ seconds: Double) -> String {
        let s = Int(seconds)
        if s < 60 { return "\(s)s" }
        if s < 3600 { return "\(s / 60)m\(String(format: "%02d", s % 60))s" }
        if s < 86400 { return "\(s / 3600)h\(String(format: "%02d", s / 60 % 60))m" }
        return "\(s / 86400)d\(s / 3600 % 24)h"
    }

    static func table(_ rows: [[String]]) -> String {
        let widths = rows[0].indices.map { column in rows.map { $0[column].count }.max()! }
        return rows.map { row in
            row.enumerated().map { index, cell in
                index == row.count - 1 ? cell : cell.padding(toLength: widths[index], withPad: " ", startingAt: 0)
            }.joined(separator: "  ")
        }.joined(separator: "\n")
    }
}

struct Tail: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print bus events as JSON lines: {\"topic\", \"header\", \"payload\"}.")

    @OptionGroup var options: ConfigOption

    @Argument(help: "Only topics that start with this prefix, e.g. fix.car or trip. Journal pages (journal.page), which repeat the records, only when the prefix names them.")
    var prefix: String = ""

    @Option(help: "Exit after this many events.")
    var count: Int?

    func run() async throws {
        let config = try loadConfig(options)
        let bus = BusClient(settings: config.process, name: "tail")
        var printed = 0
        for await message in try await bus.subscribe([prefix]) {
            // Every journal record comes alone too: pages would print each one twice.
            if message.topic == JournalPage.type, !prefix.hasPrefix("journal") { continue }
            var line = Array(#"{"topic":""#.utf8) + Array(message.topic.utf8) + Array(#"","header":"#.utf8)
            line += message.header.encoded() + Array(#","payload":"#.utf8) + message.payload + [UInt8(ascii: "}"), UInt8(ascii: "\n")]
            FileHandle.standardOutput.write(Data(line))
            printed += 1
            if let count, printed >= count { break }
        }
        await bus.shutdown()
    }
}

/// The geofence service's `dead_letters` reply.
struct DeadLetters: Codable, Sendable {
    struct Call: Codable, Sendable {
        let gate, device, state: String
        let attempts: Int
        let lastError: String?
        let finishedAt: Date?
        enum CodingKeys: String, CodingKey {
            case gate, device, state, attempts
            case lastError = "last_error"
            case finishedAt = "finished_at"
        }
    }
    let calls: [Call]
}

extension MQTTStatus {
    /// `MQTT: connected to host:port; received 12, accepted 10, …, refused 2 (too_large 1, …)`.
    var summary: String {
        func count(_ name: String) -> UInt64 { counters["mqtt." + name] ?? 0 }
        let reasons = counters.filter { $0.key.hasPrefix("mqtt.refused.") }.sorted { $0.key < $1.key }
            .map { "\($0.key.dropFirst("mqtt.refused.".count)) \($0.value)" }
        return "MQTT: \(connected ? "connected to" : "NOT connected to") \(broker); received \(count("received")), accepted \(count("accepted")), "
            + "duplicates \(count("duplicates")), ignored \(count("ignored")), refused \(count("refused"))"
            + (reasons.isEmpty ? "" : " (\(reasons.joined(separator: ", ")))")
    }
}
