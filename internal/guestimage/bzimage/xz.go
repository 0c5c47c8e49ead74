package bzimage

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"hash/crc64"
	"io"

	"github.com/ulikunitz/xz/lzma"
)

// The kernel's xz payload is made by scripts/xz_wrap.sh with the x86 BCJ
// filter in front of LZMA2, which github.com/ulikunitz/xz's stream reader
// refuses. So this file walks the .xz container itself (tukaani.org
// xz-file-format spec), feeds each block's LZMA2 data to ulikunitz's raw
// LZMA2 decoder and undoes the BCJ filter here.

const (
	xzHeaderLen  = 12
	xzFooterLen  = 12
	filterLZMA2  = 0x21
	filterX86BCJ = 0x04
)

var xzMagic = []byte{0xfd, '7', 'z', 'X', 'Z', 0}

// decodeXZ decodes one .xz stream. Bytes after the stream are allowed: the
// x86 kernel build appends the uncompressed size as a 32-bit little-endian
// word, which is checked when present.
func decodeXZ(p []byte) ([]byte, error) {
	if len(p) < xzHeaderLen+xzFooterLen || !bytes.HasPrefix(p, xzMagic) {
		return nil, errors.New("xz: not an xz stream")
	}
	flags := p[6:8]
	if crc32.ChecksumIEEE(flags) != binary.LittleEndian.Uint32(p[8:12]) {
		return nil, errors.New("xz: stream header CRC mismatch")
	}
	if flags[0] != 0 || flags[1]&0xf0 != 0 {
		return nil, fmt.Errorf("xz: unsupported stream flags %#x %#x", flags[0], flags[1])
	}
	checkType := flags[1] & 0x0f
	pos := xzHeaderLen
	var out []byte
	var blocks int
	for {
		if pos >= len(p) {
			return nil, io.ErrUnexpectedEOF
		}
		if p[pos] == 0 { // index indicator: no more blocks
			break
		}
		b, n, err := decodeBlock(p[pos:], checkType)
		if err != nil {
			return nil, fmt.Errorf("xz: block %d: %w", blocks, err)
		}
		out = append(out, b...)
		pos += n
		blocks++
	}
	end, err := skipIndex(p, pos)
	if err != nil {
		return nil, err
	}
	if rest := p[end:]; len(rest) >= 4 && bytes.Count(rest, []byte{0}) != len(rest) {
		if want := binary.LittleEndian.Uint32(rest[len(rest)-4:]); uint64(want) != uint64(len(out)) {
			return nil, fmt.Errorf("xz: decoded %d bytes, the appended size says %d", len(out), want)
		}
	}
	return out, nil
}

// decodeBlock decodes the block at the start of p and returns its data and
// its length in p (header, data, padding and check).
func decodeBlock(p []byte, checkType byte) ([]byte, int, error) {
	hlen := (int(p[0]) + 1) * 4
	if hlen > len(p) {
		return nil, 0, io.ErrUnexpectedEOF
	}
	hdr := p[:hlen]
	if crc32.ChecksumIEEE(hdr[:hlen-4]) != binary.LittleEndian.Uint32(hdr[hlen-4:]) {
		return nil, 0, errors.New("block header CRC mismatch")
	}
	bflags := hdr[1]
	nfilters := int(bflags&0x03) + 1
	if bflags&0x3c != 0 {
		return nil, 0, fmt.Errorf("reserved block flags %#x set", bflags)
	}
	r := bytes.NewReader(hdr[2 : hlen-4])
	compSize, uncompSize := int64(-1), int64(-1)
	if bflags&0x40 != 0 {
		v, err := uvarint(r)
		if err != nil {
			return nil, 0, err
		}
		compSize = int64(v)
	}
	if bflags&0x80 != 0 {
		v, err := uvarint(r)
		if err != nil {
			return nil, 0, err
		}
		uncompSize = int64(v)
	}
	type filter struct {
		id    uint64
		props []byte
	}
	filters := make([]filter, nfilters)
	for i := range filters {
		id, err := uvarint(r)
		if err != nil {
			return nil, 0, err
		}
		n, err := uvarint(r)
		if err != nil || n > uint64(r.Len()) {
			return nil, 0, fmt.Errorf("bad properties of filter %#x", id)
		}
		props := make([]byte, n)
		_, _ = io.ReadFull(r, props)
		filters[i] = filter{id, props}
	}
	last := filters[nfilters-1]
	if last.id != filterLZMA2 || len(last.props) != 1 {
		return nil, 0, fmt.Errorf("last filter is %#x, want LZMA2 (0x21)", last.id)
	}
	var bcjStart uint32
	var bcj bool
	for _, f := range filters[:nfilters-1] {
		switch {
		case f.id == filterX86BCJ && len(f.props) == 0:
			bcj = true
		case f.id == filterX86BCJ && len(f.props) == 4:
			bcj, bcjStart = true, binary.LittleEndian.Uint32(f.props)
		default:
			return nil, 0, fmt.Errorf("unsupported filter %#x (only x86 BCJ and LZMA2 are)", f.id)
		}
	}
	dictCap, err := lzma2DictSize(last.props[0])
	if err != nil {
		return nil, 0, err
	}

	data := bytes.NewReader(p[hlen:])
	zr, err := lzma.Reader2Config{DictCap: dictCap}.NewReader2(data)
	if err != nil {
		return nil, 0, fmt.Errorf("starting LZMA2: %w", err)
	}
	var buf bytes.Buffer
	if uncompSize > 0 {
		buf.Grow(int(uncompSize))
	}
	if _, err := io.Copy(&buf, zr); err != nil {
		return nil, 0, fmt.Errorf("LZMA2: %w", err)
	}
	out := buf.Bytes()
	consumed := len(p) - hlen - data.Len()
	if compSize >= 0 && int64(consumed) != compSize {
		return nil, 0, fmt.Errorf("LZMA2 data is %d bytes, header says %d", consumed, compSize)
	}
	if uncompSize >= 0 && int64(len(out)) != uncompSize {
		return nil, 0, fmt.Errorf("decoded %d bytes, header says %d", len(out), uncompSize)
	}
	if bcj {
		x86BCJDecode(out, bcjStart)
	}
	n := hlen + consumed
	n += (4 - n%4) % 4
	sum, size := checkSum(checkType, out)
	if size < 0 {
		return nil, 0, fmt.Errorf("unsupported check type %d", checkType)
	}
	if n+size > len(p) {
		return nil, 0, io.ErrUnexpectedEOF
	}
	if sum != nil && !bytes.Equal(sum, p[n:n+size]) {
		return nil, 0, errors.New("check mismatch: the payload is corrupt")
	}
	return out, n + size, nil
}

// checkSum computes the block check of type t over data; size is -1 for an
// unknown type. A nil sum with size >= 0 means "skip" (none).
func checkSum(t byte, data []byte) (sum []byte, size int) {
	var h hash.Hash
	switch t {
	case 0x00:
		return nil, 0
	case 0x01:
		h = crc32.NewIEEE()
	case 0x04:
		h = crc64.New(crc64.MakeTable(crc64.ECMA))
	case 0x0a:
		h = sha256.New()
	default:
		return nil, -1
	}
	h.Write(data)
	s := h.Sum(nil)
	if t != 0x0a { // CRCs are stored little-endian; Sum gives big-endian
		for i, j := 0, len(s)-1; i < j; i, j = i+1, j-1 {
			s[i], s[j] = s[j], s[i]
		}
	}
	return s, len(s)
}

// skipIndex validates the index and footer starting at pos and returns the
// offset just past the stream (including stream padding).
func skipIndex(p []byte, pos int) (int, error) {
	r := bytes.NewReader(p[pos+1:])
	nrec, err := uvarint(r)
	if err != nil {
		return 0, fmt.Errorf("xz: index: %w", err)
	}
	for i := uint64(0); i < 2*nrec; i++ {
		if _, err := uvarint(r); err != nil {
			return 0, fmt.Errorf("xz: index: %w", err)
		}
	}
	idxLen := len(p) - pos - r.Len()
	idxLen += (4 - idxLen%4) % 4
	if pos+idxLen+4 > len(p) || crc32.ChecksumIEEE(p[pos:pos+idxLen]) != binary.LittleEndian.Uint32(p[pos+idxLen:]) {
		return 0, errors.New("xz: index CRC mismatch")
	}
	foot := pos + idxLen + 4
	if foot+xzFooterLen > len(p) || string(p[foot+10:foot+12]) != "YZ" {
		return 0, errors.New("xz: missing stream footer")
	}
	end := foot + xzFooterLen
	for end+4 <= len(p) && binary.LittleEndian.Uint32(p[end:]) == 0 { // stream padding
		end += 4
	}
	return end, nil
}

func lzma2DictSize(b byte) (int, error) {
	if b > 40 {
		return 0, fmt.Errorf("bad LZMA2 dictionary size byte %d", b)
	}
	if b == 40 {
		return 0, errors.New("LZMA2 dictionary of 4 GiB is not supported")
	}
	size := (2 | uint64(b&1)) << (b/2 + 11)
	return int(max(size, lzma.MinDictCap)), nil
}

func uvarint(r io.ByteReader) (uint64, error) {
	v, err := binary.ReadUvarint(r)
	if err != nil {
		return 0, fmt.Errorf("bad multibyte integer: %w", err)
	}
	return v, nil
}

// x86BCJDecode undoes the x86 branch/call/jump filter in place: relative
// targets of E8 (CALL) and E9 (JMP) instructions were turned into absolute
// addresses by the encoder to help compression; this converts them back.
// start is the stream position of buf[0]. The whole stream is processed at
// once, so the last four bytes are never converted (as at a stream's end).
func x86BCJDecode(buf []byte, start uint32) {
	// For the last three positions before an opcode candidate, a bit mask
	// of which ones were themselves E8/E9 bytes decides whether the current
	// candidate is trusted, mirroring the encoder's heuristic.
	allowed := [8]bool{true, true, true, false, true, false, false, false}
	bitNum := [8]uint32{0, 1, 2, 2, 3, 3, 3, 3}
	isMS := func(b byte) bool { return b == 0x00 || b == 0xff }

	if len(buf) <= 4 {
		return
	}
	limit := len(buf) - 4
	mask := uint32(0)
	prev := -1 // position of the previous candidate; -1 means "far away"
	for i := 0; i < limit; i++ {
		if buf[i]&0xfe != 0xe8 {
			continue
		}
		dist := i - prev
		if prev < 0 || dist > 3 {
			mask = 0
		} else {
			mask = (mask << (dist - 1)) & 7
			if mask != 0 {
				b := buf[i+4-int(bitNum[mask])]
				if !allowed[mask] || isMS(b) {
					prev = i
					mask = mask<<1 | 1
					continue
				}
			}
		}
		prev = i
		if !isMS(buf[i+4]) {
			mask = mask<<1 | 1
			continue
		}
		src := binary.LittleEndian.Uint32(buf[i+1:])
		var dest uint32
		for {
			dest = src - (start + uint32(i) + 5)
			if mask == 0 {
				break
			}
			j := bitNum[mask] * 8
			if !isMS(byte(dest >> (24 - j))) {
				break
			}
			src = dest ^ (1<<(32-j) - 1)
		}
		dest &= 0x01ffffff
		dest |= -(dest & 0x01000000)
		binary.LittleEndian.PutUint32(buf[i+1:], dest)
		i += 4
	}
}
