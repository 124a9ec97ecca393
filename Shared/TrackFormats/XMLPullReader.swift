internal import CLibXML2

/// Why XML could not be read: where, and libxml2's or our own words.
public struct XMLReadError: Error, Sendable, Equatable, CustomStringConvertible {
    /// From 1; 0 when not known.
    public let line: Int
    public let message: String

    public init(line: Int, message: String) {
        self.line = line
        self.message = message
    }

    public var description: String { "line \(line): \(message)" }
}

/// A safe pull reader over untrusted XML: libxml2's `xmlTextReader`, fed a piece at a time from a
/// `ByteSource`, so memory stays bounded whatever the size of the document.
///
/// It never loads a DTD, resolves no entity but the five predefined ones and character
/// references, touches no network, and refuses a `DOCTYPE` outright (GPX has none): an entity
/// bomb or an external entity is an error, not an expansion. Input that is not well-formed, not
/// in its declared encoding (UTF-8 by default) or nested deeper than `maxDepth` is an error that
/// names the line. Every name and value it hands out is valid UTF-8. It never traps.
///
/// `next()` moves to the next start tag, end tag or text; an empty element (`<a/>`) comes as a
/// start followed by an end. Comments, processing instructions and whitespace between elements
/// are skipped. Not thread-safe: one reader, one thread at a time.
public final class XMLPullReader {
    public enum Node: Sendable, Equatable {
        case start
        case end
        case text
    }

    /// Deep enough for any GPX (which needs about seven levels) and far below libxml2's own 256.
    public static let defaultMaxDepth = 100

    public let maxDepth: Int
    /// Of the current element (for text, of the element it is in): 1 for the root.
    public private(set) var depth = 0
    private let reader: xmlTextReaderPtr?
    private let context: Context
    private var pendingEnd = false
    private var finished = false

    final class Context {
        let source: ByteSource
        var sourceError: ByteSourceError?
        var error: XMLReadError?

        init(source: ByteSource) { self.source = source }
    }

    public init(source: ByteSource, maxDepth: Int = XMLPullReader.defaultMaxDepth) {
        _ = libxml2Initialized
        self.maxDepth = max(1, maxDepth)
        context = Context(source: source)
        // No NOENT (entities are not substituted), no DTDLOAD, DTDATTR or DTDVALID (no DTD is
        // read), no XINCLUDE, no HUGE (libxml2's limits on names, text and depth stay), no
        // network. Errors come to the handler below, not to standard error.
        let options = Int32(XML_PARSE_NONET.rawValue | XML_PARSE_NOERROR.rawValue | XML_PARSE_NOWARNING.rawValue | XML_PARSE_BIG_LINES.rawValue)
        reader = xmlReaderForIO(xmlReadCallback, xmlCloseCallback, Unmanaged.passUnretained(context).toOpaque(), nil, nil, options)
        if let reader {
            xmlTextReaderSetStructuredErrorHandler(reader, xmlErrorCallback, Unmanaged.passUnretained(context).toOpaque())
        }
    }

    deinit {
        // The close callback still sees `context`: stored properties outlive `deinit`'s body.
        if let reader { xmlFreeTextReader(reader) }
    }

    /// The next node, or `nil` at the end of a complete document.
    public func next() throws(XMLReadError) -> Node? {
        if pendingEnd {
            pendingEnd = false
            return .end
        }
        guard !finished else { return nil }
        guard let reader else { throw XMLReadError(line: 0, message: "libxml2 could not start a reader") }
        while true {
            let result = xmlTextReaderRead(reader)
            if let error = context.sourceError { throw fail(XMLReadError(line: parserLine, message: error.message)) }
            if let error = context.error { throw fail(error) }
            if result == 0 {
                finished = true
                return nil
            }
            guard result == 1 else { throw fail(XMLReadError(line: parserLine, message: "not well-formed")) }
            switch xmlTextReaderNodeType(reader) {
            case Int32(XML_READER_TYPE_ELEMENT.rawValue):
                depth = Int(xmlTextReaderDepth(reader)) + 1
                guard depth <= maxDepth else { throw fail(XMLReadError(line: line, message: "elements nested deeper than \(maxDepth)")) }
                // libxml2 refuses bytes that are not UTF-8, but it has handed them to SAX callbacks
                // first (where Foundation's XMLParser traps on them): checked again here.
                guard Self.isUTF8(xmlTextReaderConstName(reader)) else { throw fail(XMLReadError(line: line, message: "an element name is not valid UTF-8")) }
                while xmlTextReaderMoveToNextAttribute(reader) == 1 {
                    guard Self.isUTF8(xmlTextReaderConstName(reader)), Self.isUTF8(xmlTextReaderConstValue(reader)) else {
                        xmlTextReaderMoveToElement(reader)
                        throw fail(XMLReadError(line: line, message: "an attribute of <\(localName.prefix(64))> is not valid UTF-8"))
                    }
                }
                xmlTextReaderMoveToElement(reader)
                if xmlTextReaderIsEmptyElement(reader) == 1 { pendingEnd = true }
                return .start
            case Int32(XML_READER_TYPE_END_ELEMENT.rawValue):
                depth = Int(xmlTextReaderDepth(reader)) + 1
                return .end
            case Int32(XML_READER_TYPE_TEXT.rawValue), Int32(XML_READER_TYPE_CDATA.rawValue), Int32(XML_READER_TYPE_SIGNIFICANT_WHITESPACE.rawValue):
                depth = Int(xmlTextReaderDepth(reader))
                return .text
            case Int32(XML_READER_TYPE_DOCUMENT_TYPE.rawValue):
                throw fail(XMLReadError(line: line, message: "a DOCTYPE is not allowed"))
            case Int32(XML_READER_TYPE_ENTITY_REFERENCE.rawValue), Int32(XML_READER_TYPE_ENTITY.rawValue):
                throw fail(XMLReadError(line: line, message: "entity references are not allowed"))
            default:
                continue  // comments, processing instructions, whitespace between elements
            }
        }
    }

    private func fail(_ error: XMLReadError) -> XMLReadError {
        finished = true
        pendingEnd = false
        return error
    }

    /// The line of the current node (for an element, where its start tag ends).
    public var line: Int {
        guard let reader, let node = xmlTextReaderCurrentNode(reader) else { return parserLine }
        let line = xmlGetLineNo(node)
        return line > 0 ? Int(line) : parserLine
    }

    /// Where libxml2 has got to, which can be ahead of the current node.
    private var parserLine: Int {
        guard let reader else { return 0 }
        return max(0, Int(xmlTextReaderGetParserLineNumber(reader)))
    }

    /// The current element's name without its namespace prefix.
    public var localName: String {
        guard let reader else { return "" }
        return Self.string(xmlTextReaderConstLocalName(reader)) ?? ""
    }

    /// Whether the current element's local name is `name` (ASCII), without making a `String`.
    public func isNamed(_ name: StaticString) -> Bool {
        guard let reader, let bytes = xmlTextReaderConstLocalName(reader) else { return false }
        return Self.equals(bytes, name)
    }

    /// The value of the current element's attribute whose local name is `name`, if it has one.
    public func attribute(_ name: StaticString) throws(XMLReadError) -> String? {
        guard let reader else { return nil }
        defer { xmlTextReaderMoveToElement(reader) }
        while xmlTextReaderMoveToNextAttribute(reader) == 1 {
            guard let local = xmlTextReaderConstLocalName(reader), Self.equals(local, name) else { continue }
            guard xmlTextReaderIsNamespaceDecl(reader) != 1 else { continue }
            guard let value = Self.string(xmlTextReaderConstValue(reader)) else {
                throw XMLReadError(line: line, message: "attribute \(name) is not valid UTF-8")
            }
            return value
        }
        return nil
    }

    /// All attributes of the current element but namespace declarations, by local name.
    public func attributes() throws(XMLReadError) -> [(name: String, value: String)] {
        guard let reader else { return [] }
        defer { xmlTextReaderMoveToElement(reader) }
        var out: [(name: String, value: String)] = []
        while xmlTextReaderMoveToNextAttribute(reader) == 1 {
            guard xmlTextReaderIsNamespaceDecl(reader) != 1 else { continue }
            guard let name = Self.string(xmlTextReaderConstLocalName(reader)), let value = Self.string(xmlTextReaderConstValue(reader)) else {
                throw XMLReadError(line: line, message: "an attribute is not valid UTF-8")
            }
            out.append((name, value))
        }
        return out
    }

    /// The current text node's content (empty if it were not UTF-8; `appendText` gives bytes).
    public var text: String {
        guard let reader else { return "" }
        return Self.string(xmlTextReaderConstValue(reader)) ?? ""
    }

    /// Appends the current text node's bytes to `buffer`, at most until it holds `limit` bytes;
    /// returns false if some were left out.
    public func appendText(to buffer: inout [UInt8], limit: Int) -> Bool {
        guard let reader, let value = xmlTextReaderConstValue(reader) else { return true }
        let length = strlen(value)
        let room = max(0, limit - buffer.count)
        buffer.append(contentsOf: UnsafeBufferPointer(start: value, count: min(length, room)))
        return length <= room
    }

    // MARK: Bytes from libxml2

    private static func string(_ bytes: UnsafePointer<xmlChar>?) -> String? {
        guard let bytes else { return nil }
        let buffer = UnsafeBufferPointer(start: bytes, count: strlen(bytes))
        guard UTF8Validation.isValid(buffer) else { return nil }
        return String(decoding: buffer, as: UTF8.self)
    }

    private static func isUTF8(_ bytes: UnsafePointer<xmlChar>?) -> Bool {
        guard let bytes else { return true }
        return UTF8Validation.isValid(UnsafeBufferPointer(start: bytes, count: strlen(bytes)))
    }

    private static func equals(_ bytes: UnsafePointer<xmlChar>, _ name: StaticString) -> Bool {
        let count = name.utf8CodeUnitCount
        let expected = name.utf8Start
        for index in 0..<count where bytes[index] != expected[index] { return false }  // a NUL stops a shorter name
        return bytes[count] == 0
    }
}

private func strlen(_ bytes: UnsafePointer<xmlChar>) -> Int {
    var count = 0
    while bytes[count] != 0 { count += 1 }
    return count
}

/// `xmlInitParser` once per process, before any reader: libxml2 is then safe to use from
/// several threads, one reader per thread.
private let libxml2Initialized: Void = xmlInitParser()

private let xmlReadCallback: xmlInputReadCallback = { context, buffer, length in
    guard let context, let buffer, length > 0 else { return 0 }
    let box = Unmanaged<XMLPullReader.Context>.fromOpaque(context).takeUnretainedValue()
    guard box.sourceError == nil else { return -1 }
    do throws(ByteSourceError) {
        let count = try box.source.read(into: UnsafeMutableRawBufferPointer(start: buffer, count: Int(length)))
        return Int32(clamping: min(count, Int(length)))
    } catch {
        box.sourceError = error
        return -1
    }
}

private let xmlCloseCallback: xmlInputCloseCallback = { _ in 0 }

/// Keeps the first error. Warnings, and namespace errors (an undeclared prefix, which
/// Foundation's parser let through and real GPX extensions have), do not stop the reader.
private let xmlErrorCallback: xmlStructuredErrorFunc = { context, error in
    guard let context, let error else { return }
    let box = Unmanaged<XMLPullReader.Context>.fromOpaque(context).takeUnretainedValue()
    let report = error.pointee
    guard box.error == nil, report.level.rawValue >= XML_ERR_ERROR.rawValue else { return }
    if report.level.rawValue == XML_ERR_ERROR.rawValue, report.domain == Int32(XML_FROM_NAMESPACE.rawValue) { return }
    // String(cString:) repairs invalid UTF-8 (a message may quote the bad bytes) instead of trapping.
    var message = report.message.map { String(cString: $0) } ?? "XML error \(report.code)"
    message = message.split(whereSeparator: { $0 == "\n" || $0 == "\r" }).map { $0.trimmingSpaces() }.filter { !$0.isEmpty }.joined(separator: " ")
    if report.int2 > 0 { message += " (column \(report.int2))" }
    box.error = XMLReadError(line: max(0, Int(report.line)), message: message)
}

extension Substring {
    fileprivate func trimmingSpaces() -> String {
        var slice = self[...]
        while let first = slice.first, first == " " || first == "\t" { slice = slice.dropFirst() }
        while let last = slice.last, last == " " || last == "\t" { slice = slice.dropLast() }
        return String(slice)
    }
}
