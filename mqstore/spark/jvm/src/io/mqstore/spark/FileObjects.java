package io.mqstore.spark;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;

/**
 * The objects of a file:// tier, read with java.nio: a range is a pread of the object's file, the channel of
 * the last object read kept open for the next range (a reader walks one segment at a time).
 */
final class FileObjects implements TierObjects {
    private final TierLocation location;
    private String openKey;
    private FileChannel channel;

    FileObjects(TierLocation location) {
        this.location = location;
    }

    private Path path(String key) {
        return Paths.get(location.root, key.split("/"));
    }

    @Override
    public byte[] readAll(String key, int bytesMax) throws IOException {
        Path path = path(key);
        try {
            if (Files.size(path) > bytesMax) {
                throw new IOException(location.display(key) + " is " + Files.size(path) + " bytes, more than "
                        + bytesMax);
            }
            return Files.readAllBytes(path);
        } catch (NoSuchFileException e) {
            return null;
        }
    }

    @Override
    public void readRange(String key, long offset, byte[] into, int at, int count) throws IOException {
        if (!key.equals(openKey)) {
            close();
            try {
                channel = FileChannel.open(path(key), StandardOpenOption.READ);
            } catch (NoSuchFileException e) {
                throw TierObjects.missing(location, key, offset);
            }
            openKey = key;
        }
        ByteBuffer buffer = ByteBuffer.wrap(into, at, count);
        while (buffer.hasRemaining()) {
            long position = Math.addExact(offset, buffer.position() - at);
            if (channel.read(buffer, position) < 0) {
                throw TierObjects.shorter(location, key, position, Math.addExact(offset, count));
            }
        }
    }

    @Override
    public void close() throws IOException {
        if (channel != null) {
            channel.close();
            channel = null;
            openKey = null;
        }
    }
}
