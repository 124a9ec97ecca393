import DrivebusJournal
import DrivebusSchema
import Logging

/// How ingest puts what its journal committed on the bus: each record as a message of its own
/// (`fix.car`…, what external tools such as `drivebus tail fix.` subscribe to), and the same
/// records in `journal.page` messages, which journal followers and the MQTT bridge take. The
/// publisher does not make a message nobody subscribed to (`ZMQSendingSocket`), so either form
/// costs next to nothing while only the other is wanted.
public enum JournalBroadcast {
    /// Called on the journal's writer thread with one commit's records, in seq order.
    public static func publish(_ committed: [(entry: Journal.Entry, record: JournalRecord)], on publisher: Publisher, logger: Logger) {
        var page = JournalPage.Builder()
        for (entry, record) in committed {
            do {
                try publisher.publish(record.type, device: record.device, payloadJSON: entry.payload, logSeq: entry.seq)
            } catch {
                logger.error("journaled seq \(entry.seq) not published: \(error)")
            }
            if page.isFull(adding: entry.topic.utf8.count + entry.payload.count) { send(&page, on: publisher, logger: logger) }
            page.append(seq: entry.seq, topic: entry.topic, payload: entry.payload)
        }
        send(&page, on: publisher, logger: logger)
    }

    private static func send(_ page: inout JournalPage.Builder, on publisher: Publisher, logger: Logger) {
        guard let (firstSeq, payload) = page.take() else { return }
        do {
            try publisher.publish(JournalPage.type, payloadJSON: payload, logSeq: firstSeq)
        } catch {
            // Followers see the gap at the next page or heartbeat and replay it.
            logger.error("journal page from seq \(firstSeq) not published: \(error)")
        }
    }
}
