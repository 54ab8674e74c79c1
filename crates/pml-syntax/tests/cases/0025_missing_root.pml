<module name="orphan">A module without a schema.</module>
