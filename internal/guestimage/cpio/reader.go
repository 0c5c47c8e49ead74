package cpio

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// Record is one member read back from an archive.
type Record struct {
	Header
	Data []byte
}

// ReadAll parses a newc archive up to its trailer. It exists to verify what
// Writer produced (tests, `hull guest` inspection); it is strict about the
// format and does not support other cpio dialects.
func ReadAll(r io.Reader) ([]Record, error) {
	br := bufio.NewReader(r)
	var out []Record
	var off int64
	for {
		var hdr [headerLen]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return out, fmt.Errorf("cpio: reading header at offset %d: %w", off, noEOF(err))
		}
		if string(hdr[:6]) != magic {
			return out, fmt.Errorf("cpio: bad magic %q at offset %d", hdr[:6], off)
		}
		var f [13]uint32
		for i := range f {
			v, err := strconv.ParseUint(string(hdr[6+8*i:14+8*i]), 16, 32)
			if err != nil {
				return out, fmt.Errorf("cpio: bad header field %d at offset %d: %w", i, off, err)
			}
			f[i] = uint32(v)
		}
		namesize := int(f[11])
		if namesize < 1 || namesize > 4096 {
			return out, fmt.Errorf("cpio: bad name size %d at offset %d", namesize, off)
		}
		name := make([]byte, namesize+padLen(headerLen+namesize))
		if _, err := io.ReadFull(br, name); err != nil {
			return out, fmt.Errorf("cpio: reading name at offset %d: %w", off, noEOF(err))
		}
		if name[namesize-1] != 0 {
			return out, fmt.Errorf("cpio: name not NUL-terminated at offset %d", off)
		}
		rec := Record{Header: Header{
			Name: string(name[:namesize-1]), Ino: f[0], Mode: f[1], UID: f[2], GID: f[3],
			Nlink: f[4], Mtime: f[5], Size: f[6], DevMajor: f[7], DevMinor: f[8],
			RdevMaj: f[9], RdevMin: f[10],
		}}
		rec.Data = make([]byte, int(rec.Size)+padLen(int(rec.Size)))
		if _, err := io.ReadFull(br, rec.Data); err != nil {
			return out, fmt.Errorf("cpio: reading data of %q: %w", rec.Name, noEOF(err))
		}
		rec.Data = rec.Data[:rec.Size]
		off += int64(headerLen + len(name) + int(rec.Size) + padLen(int(rec.Size)))
		if rec.Name == trailer {
			return out, nil
		}
		out = append(out, rec)
	}
}

func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
