package io.mqstore.spark;

/**
 * Bytes of a segment break a rule of the CommitLog format (commitlog/format.py): the message names the file,
 * the byte position in it and the rule, as the Python reader's CorruptionError does.
 */
public final class CorruptLogException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public final String path;
    public final long position;
    public final String rule;

    public CorruptLogException(String message, String path, long position, String rule) {
        super(message + " [rule " + rule + "] (file " + path + ", offset " + position + ")");
        this.path = path;
        this.position = position;
        this.rule = rule;
    }
}
