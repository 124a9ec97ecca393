// libxml2's pull reader, for DrivebusTrackFormats' XMLPullReader.
//
// Debian builds libxml2 with ICU, so encoding.h would include the system's <unicode/ucnv.h>,
// whose enums clash with the ICU copy inside Foundation (_FoundationICU) in any Swift file that
// sees both. Nothing here uses the ICU parts (the converters of xmlCharEncodingHandler), so
// they are left out of this module's view; the library itself is unchanged.
#include <libxml/xmlversion.h>
#undef LIBXML_ICU_ENABLED
#include <libxml/parser.h>
#include <libxml/xmlreader.h>
#include <libxml/xmlerror.h>
