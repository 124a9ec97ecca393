/// Lines of bytes from a `ByteSource`, read 64 KiB at a time. A line ends at `\n`, `\r\n` or a
/// lone `\r`; lines are numbered from 1.
struct LineReader {
    private let source: ChunkedReader
    private let maxLineBytes: Int
    private var buffer: [UInt8] = []
    private var start = 0
    private var ended = false
    private(set) var lineNumber = 0

    init(source: ByteSource, maxLineBytes: Int) {
        self.source = ChunkedReader(source)
        self.maxLineBytes = max(1, maxLineBytes)
    }

    /// The next line without its line break, or `nil` at the end.
    mutating func next() throws(TrackFormatError) -> ArraySlice<UInt8>? {
        var scanned = start
        while true {
            if let end = lineBreak(from: scanned) {
                // A `\r` as the last byte read may be the first half of `\r\n`.
                if buffer[end] == 0x0D, end + 1 == buffer.count, !ended {
                    let consumed = start
                    try fill()
                    scanned = end - consumed
                    continue
                }
                let line = buffer[start..<end]
                start = end + (buffer[end] == 0x0D && end + 1 < buffer.count && buffer[end + 1] == 0x0A ? 2 : 1)
                lineNumber += 1
                guard line.count <= maxLineBytes else { throw tooLong() }
                return line
            }
            scanned = buffer.count
            guard scanned - start <= maxLineBytes else {
                lineNumber += 1
                throw tooLong()
            }
            if ended {
                guard start < buffer.count else { return nil }
                let line = buffer[start...]
                start = buffer.count
                lineNumber += 1
                return line
            }
            let consumed = start
            try fill()
            scanned -= consumed
        }
    }

    /// The index of the first `\n` or `\r` from `index` on.
    private func lineBreak(from index: Int) -> Int? {
        buffer.withUnsafeBufferPointer { bytes in
            var index = index
            while index < bytes.count {
                if bytes[index] == 0x0A || bytes[index] == 0x0D { return index }
                index += 1
            }
            return nil
        }
    }

    private func tooLong() -> TrackFormatError {
        TrackFormatError(location: "line \(lineNumber)", message: "longer than \(maxLineBytes) bytes")
    }

    /// Drops what was consumed and appends the next piece of the source.
    private mutating func fill() throws(TrackFormatError) {
        if start > 0 {
            buffer.removeFirst(start)
            start = 0
        }
        let count = try source.read(appendingTo: &buffer)
        if count == 0 { ended = true }
    }
}

/// CSV with a header line: `timestamp|time, latitude|lat, longitude|lon, speed|speed_mps?,
/// altitude|ele|altitude_m?, bearing|course|course_deg?, accuracy|accuracy_m?` in any order, other columns ignored.
/// Cells may be quoted (`"…"`, `""` for a quote); blank lines are skipped. An empty cell is a
/// value not given; a row without a time is a point without one. A cell cannot hold a line break.
final class CSVTrackReader: FormatReader {
    private var lines: LineReader
    private var columns: [String] = []
    private var time = 0, lat = 0, lon = 0
    private var speed: Int?, altitude: Int?, course: Int?, accuracy: Int?
    private var readHeader = false

    init(source: ByteSource, limits: TrackLimits) {
        lines = LineReader(source: source, maxLineBytes: limits.maxLineBytes)
    }

    func next() throws(TrackFormatError) -> TrackReader.Event? {
        while let line = try lines.next() {
            var bytes = line
            if lines.lineNumber == 1, bytes.starts(with: [0xEF, 0xBB, 0xBF]) { bytes = bytes.dropFirst(3) }  // a byte-order mark
            guard bytes.contains(where: { $0 != 0x20 && $0 != 0x09 }) else { continue }
            let location = "line \(lines.lineNumber)"
            let cells = Self.cells(bytes)
            guard readHeader else {
                try header(cells, location: location)
                continue
            }
            return .point(try row(cells, location: location))
        }
        return nil
    }

    private func header(_ cells: [ArraySlice<UInt8>], location: String) throws(TrackFormatError) {
        columns = cells.map { String(decoding: $0, as: UTF8.self).lowercased() }
        func column(_ names: String...) -> Int? { names.lazy.compactMap { self.columns.firstIndex(of: $0) }.first }
        guard let time = column("timestamp", "time"), let lat = column("latitude", "lat"), let lon = column("longitude", "lon") else {
            throw TrackFormatError(location: location, message: "the header needs timestamp (or time), latitude (or lat) and longitude (or lon)")
        }
        (self.time, self.lat, self.lon) = (time, lat, lon)
        speed = column("speed", "speed_mps")
        altitude = column("altitude", "ele", "altitude_m")
        course = column("bearing", "course", "course_deg")
        accuracy = column("accuracy", "accuracy_m")
        readHeader = true
    }

    private func row(_ cells: [ArraySlice<UInt8>], location: String) throws(TrackFormatError) -> TrackReader.Point {
        func cell(_ index: Int?) -> ArraySlice<UInt8>? {
            guard let index, index < cells.count, !cells[index].isEmpty else { return nil }
            return cells[index]
        }
        func number(_ index: Int?) throws(TrackFormatError) -> Double? {
            guard let index, let text = cell(index) else { return nil }
            guard let value = Values.number(text) else {
                throw TrackFormatError(location: location, message: "\(columns[index]) \(Values.quoted(bytes: text)) is not a number")
            }
            return value
        }
        guard let lat = try number(lat), let lon = try number(lon) else {
            throw TrackFormatError(location: location, message: "latitude and longitude are required")
        }
        if let problem = Values.checkLatitude(lat) { throw TrackFormatError(location: location, message: "\(columns[self.lat]) " + problem) }
        if let problem = Values.checkLongitude(lon) { throw TrackFormatError(location: location, message: "\(columns[self.lon]) " + problem) }
        var point = TrackReader.Point(lat: lat, lon: lon, location: location)
        if let text = cell(time) {
            guard UTF8Validation.isValid(text) else { throw TrackFormatError(location: location, message: "\(columns[time]) is not valid UTF-8") }
            switch Values.time(String(decoding: text, as: UTF8.self)) {
            case .success(let date): point.time = date
            case .failure(let error): throw TrackFormatError(location: location, message: "\(columns[time]): \(error.reason)")
            }
        }
        point.elevationM = try number(altitude)
        if let elevation = point.elevationM, let problem = Values.checkElevation(elevation) {
            throw TrackFormatError(location: location, message: "\(columns[altitude!]) " + problem)
        }
        point.speedMps = try number(speed)
        point.courseDeg = try number(course)
        point.accuracyM = try number(accuracy)
        return point
    }

    /// Splits at commas outside quotes; each cell trimmed of spaces and tabs, its quotes removed.
    static func cells(_ line: ArraySlice<UInt8>) -> [ArraySlice<UInt8>] {
        var cells: [ArraySlice<UInt8>] = []
        var current: [UInt8] = []
        // Whether `current` holds only spaces and tabs: kept as bytes arrive, since checking it at
        // every quote made a line of many quotes quadratic.
        var currentIsBlank = true
        var quoted = false
        var index = line.startIndex
        var wasQuoted = false
        func append(_ byte: UInt8) {
            current.append(byte)
            if byte != 0x20 && byte != 0x09 { currentIsBlank = false }
        }
        func finish() {
            var cell = current[...]
            if !wasQuoted {
                while let first = cell.first, first == 0x20 || first == 0x09 { cell = cell.dropFirst() }
                while let last = cell.last, last == 0x20 || last == 0x09 { cell = cell.dropLast() }
            }
            cells.append(cell)
            current.removeAll(keepingCapacity: true)
            currentIsBlank = true
            wasQuoted = false
        }
        while index < line.endIndex {
            let byte = line[index]
            index += 1
            if quoted {
                if byte == UInt8(ascii: "\"") {
                    if index < line.endIndex, line[index] == UInt8(ascii: "\"") {
                        append(byte)
                        index += 1
                    } else {
                        quoted = false
                    }
                } else {
                    append(byte)
                }
            } else if byte == UInt8(ascii: ",") {
                finish()
            } else if byte == UInt8(ascii: "\""), currentIsBlank {
                current.removeAll(keepingCapacity: true)
                currentIsBlank = true
                quoted = true
                wasQuoted = true
            } else if wasQuoted, byte == 0x20 || byte == 0x09 {
                continue  // spaces after a closing quote
            } else {
                append(byte)
            }
        }
        finish()
        return cells
    }
}
