import DrivebusKit
import DrivebusMQTT
import DrivebusSchema
import Foundation
import Logging
import MQTTCore
import Synchronization

/// Hands OwnTracks messages to ingest's journal and returns only once they are there, so that the
/// client acknowledges nothing that is not durable. Runs on the MQTT client's thread.
struct OwnTracksInbound: Sendable {
    let bus: BusClient
    let configuration: MQTTConfiguration
    let devices: DeviceBook
    let counters: Counters
    let logger: Logger

    /// `true` once every message is journaled or refused for good; `false` if `giveUpWhen` became
    /// true first (the messages stay unacknowledged, and the broker delivers them again).
    func store(_ messages: [MQTTMessage], giveUpWhen stopping: @Sendable () -> Bool) -> Bool {
        counters.add("received", messages.count)
        var known = devices.ids
        var reloaded = false
        var batch: [IngestRPCMessages.PublishOwnTracks.Message] = []
        for message in messages {
            var routed = OwnTracksTopics.route(topic: message.topic, payload: message.payload, configuration: configuration, knownDevices: known)
            if case .failure(let refusal) = routed, refusal.code == "mqtt.unknown_device", !reloaded {
                // Perhaps added a moment ago: look once before refusing.
                known = devices.reloadBlocking()
                reloaded = true
                routed = OwnTracksTopics.route(topic: message.topic, payload: message.payload, configuration: configuration, knownDevices: known)
            }
            switch routed {
            case .success(let routed):
                batch.append(.init(device: routed.device, payload: routed.payload))
            case .failure(let refusal):
                refuse(refusal.code, "\(message.topic): \(refusal)")
            }
        }
        // One RPC carries at most a few MB.
        var chunk: [IngestRPCMessages.PublishOwnTracks.Message] = []
        var bytes = 0
        for message in batch {
            if bytes + message.payload.utf8.count > Self.maxRequestBytes, !chunk.isEmpty {
                guard journal(chunk, giveUpWhen: stopping) else { return false }
                chunk = []
                bytes = 0
            }
            chunk.append(message)
            bytes += message.payload.utf8.count
        }
        return chunk.isEmpty || journal(chunk, giveUpWhen: stopping)
    }

    static let maxRequestBytes = 4 << 20

    /// Sends one batch to ingest until it is journaled (or refused for good).
    private func journal(_ batch: [IngestRPCMessages.PublishOwnTracks.Message], giveUpWhen stopping: @Sendable () -> Bool) -> Bool {
        var delay = Duration.milliseconds(50)
        while true {
            switch call(batch) {
            case .success(let stored):
                counters.add("accepted", stored.accepted)
                counters.add("duplicates", stored.duplicates)
                counters.add("ignored", stored.ignored)
                for refusal in stored.refused {
                    refuse(refusal.code, "\(batch.indices.contains(refusal.index) ? batch[refusal.index].device : "?"): \(refusal.message)")
                }
                return true
            case .failure(let error as RPCErrorBody) where error.code == "rpc.bad_request":
                // Ingest cannot read the request at all: retrying would never end.
                logger.error("ingest refused a batch of \(batch.count) messages: \(error.message)")
                counters.add("refused", batch.count)
                return true
            case .failure(let error):
                counters.add("store_retries")
                logger.warning("ingest did not take \(batch.count) messages, retrying: \(error)")
                if stopping() { return false }
                Thread.sleep(forTimeInterval: delay.inSeconds)
                delay = min(delay * 2, .seconds(2))
                if stopping() { return false }
            }
        }
    }

    private func refuse(_ code: String, _ detail: String) {
        counters.add("refused")
        counters.add("refused." + code.replacingOccurrences(of: "mqtt.", with: "").replacingOccurrences(of: "ingest.", with: ""))
        logger.notice("refused: \(detail)")
    }

    /// The RPC, waited for on this (the client's own) thread.
    private func call(_ batch: [IngestRPCMessages.PublishOwnTracks.Message]) -> Result<IngestRPCMessages.OwnTracksStored, any Error> {
        let done = DispatchSemaphore(value: 0)
        let result = Mutex<Result<IngestRPCMessages.OwnTracksStored, any Error>?>(nil)
        let request = IngestRPCMessages.PublishOwnTracks(messages: batch)
        Task { [bus] in
            let outcome: Result<IngestRPCMessages.OwnTracksStored, any Error>
            do {
                outcome = .success(try await bus.call(.ingest, request, as: IngestRPCMessages.OwnTracksStored.self, timeout: .seconds(10)))
            } catch {
                outcome = .failure(error)
            }
            result.withLock { $0 = outcome }
            done.signal()
        }
        done.wait()
        return result.withLock { $0! }
    }
}
