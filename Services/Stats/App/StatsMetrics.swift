import DrivebusKit
import Foundation
import Prometheus
import StatsCore
import StatsStore

/// `GET /metrics`: every service's work, from the heartbeats, and the store's own.
final class StatsMetrics: Sendable {
    private let registry = PrometheusCollectorRegistry()
    private let batchDuration: DurationHistogram

    init() {
        batchDuration = registry.makeDurationHistogram(
            name: "drivebus_stats_store_batch_seconds",
            buckets: [.milliseconds(1), .milliseconds(5), .milliseconds(20), .milliseconds(100), .milliseconds(500), .seconds(2)],
            help: "Time to store one batch of bus events in SQLite")
    }

    func record(_ beat: Heartbeat) {
        let service = [("service", beat.service)]
        registry.makeGauge(name: "drivebus_service_up", labels: service, help: "1 while the service heartbeats").set(to: beat.status == "ok" ? 1.0 : 0.0)
        registry.makeGauge(name: "drivebus_service_uptime_seconds", labels: service, help: "Seconds since the service started").set(to: beat.uptimeS)
        registry.makeGauge(name: "drivebus_service_published_seq", labels: service, help: "Messages the service published in this run").set(to: Double(beat.publishedSeq))
        for (stream, value) in beat.lastSeq {
            registry.makeGauge(name: "drivebus_service_last_seq", labels: service + [("stream", stream)], help: "The last sequence number the service processed").set(to: Double(value))
        }
        for (name, value) in beat.counters ?? [:] {
            // `dropped_readings.<reading>.<reason>` from ingest; others by their name.
            let parts = name.split(separator: ".")
            if parts.count == 3, parts[0] == "dropped_readings" {
                registry.makeGauge(
                    name: "drivebus_ingest_dropped_readings", labels: [("reading", String(parts[1])), ("reason", String(parts[2]))],
                    help: "Optional readings left out of fixes since ingest started: impossible values and clients' placeholders"
                ).set(to: Double(value))
            } else if parts.count == 3, parts[0] == "mqtt", parts[1] == "refused" {
                registry.makeGauge(
                    name: "drivebus_mqtt_refused_by_code", labels: [("code", String(parts[2]))],
                    help: "MQTT messages refused since drivebus-mqtt started, by error code").set(to: Double(value))
            } else if parts.count == 2, parts[0] == "mqtt" {
                registry.makeGauge(name: "drivebus_mqtt_\(parts[1])", help: "drivebus-mqtt's \(parts[1]) since it started").set(to: Double(value))
            }
        }
    }

    func stored(_ events: [StoredEvent], summary: StatsStore.Summary, took duration: Duration) {
        batchDuration.record(duration)
        var byType: [String: Int] = [:]
        for event in events { byType[event.type, default: 0] += 1 }
        for (type, count) in byType {
            registry.makeCounter(name: "drivebus_stats_events_total", labels: [("type", type)], help: "Bus events received by stats").increment(by: Int64(count))
        }
        registry.makeCounter(name: "drivebus_stats_duplicates_total", help: "Events stats already had").increment(by: Int64(summary.duplicates))
    }

    func text() -> String { registry.emitToString() }
}
